"""`x-mcp-header` annotations from 2026-07-28 streamable-http §Schema Extension, as input schemas.

Shared by test_headers (the validator) and test_legacy_to_modern (tools/list screening).
"""

from __future__ import annotations

from typing import Any


def _prop(header: Any, kind: Any = "string") -> dict[str, Any]:
    schema: dict[str, Any] = {"x-mcp-header": header}
    if kind is not None:
        schema["type"] = kind
    return schema


def _object(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


INVALID_SCHEMAS: dict[str, dict[str, Any]] = {
    "empty": _object(region=_prop("")),
    "not a string": _object(region=_prop(7)),
    "space is not a tchar": _object(region=_prop("Cloud Region")),
    "colon is not a tchar": _object(region=_prop("Region:x")),
    "separator is not a tchar": _object(region=_prop("Region(x)")),
    "non-ascii is not a tchar": _object(region=_prop("Régión")),
    "control char LF inside": _object(region=_prop("Reg\nion")),
    "control char CR inside": _object(region=_prop("Reg\rion")),
    "control char LF at the end": _object(region=_prop("Region\n")),
    "control char TAB": _object(region=_prop("Region\t")),
    "control char NUL": _object(region=_prop("Reg\x00ion")),
    "duplicate case-insensitively": _object(a=_prop("Region"), b=_prop("REGION")),
    "duplicate in nested objects": _object(a=_prop("Tenant"), o=_object(b=_prop("tenant")) | {"type": "object"}),
    "type number": _object(ratio=_prop("Ratio", "number")),
    "type object": _object(o=_prop("Obj", "object")),
    "type array": _object(a=_prop("Arr", "array")),
    "type null": _object(a=_prop("Nil", "null")),
    "no type": _object(a=_prop("Untyped", None)),
    "on the root schema": {"type": "object", "x-mcp-header": "Root", "properties": {}},
    "under items": _object(list={"type": "array", "items": _prop("Item")}),
    "under prefixItems": _object(list={"type": "array", "prefixItems": [_prop("Item")]}),
    "under anyOf": _object(a={"anyOf": [_prop("A"), {"type": "integer"}]}),
    "under oneOf": _object(a={"oneOf": [_prop("A")]}),
    "under allOf": _object(a={"allOf": [_prop("A")]}),
    "under not": _object(a={"not": _prop("A")}),
    "under if/then/else": _object(a={"if": {"type": "string"}, "then": _prop("A"), "else": {}}),
    "under $ref target in $defs": {
        "type": "object",
        "properties": {"region": {"$ref": "#/$defs/Region"}},
        "$defs": {"Region": _prop("Region")},
    },
    "under $ref target in definitions": {
        "type": "object",
        "properties": {"region": {"$ref": "#/definitions/Region"}},
        "definitions": {"Region": _prop("Region")},
    },
    "under properties reached through anyOf": {
        "type": "object",
        "anyOf": [_object(region=_prop("Region"))],
    },
    "under additionalProperties": {"type": "object", "additionalProperties": _prop("Extra")},
    "under dependentSchemas": {"type": "object", "dependentSchemas": {"a": _object(b=_prop("Dep"))}},
    "under patternProperties": {"type": "object", "patternProperties": {"^r": _prop("Pattern")}},
}

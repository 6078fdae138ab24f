"""Streamable HTTP request-metadata headers (2026-07-28): values, encoding, x-mcp-header.

Spec: 2026-07-28/basic/transports/streamable-http.mdx §Request Metadata, §Value Encoding;
2026-07-28/server/tools.mdx §x-mcp-header.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any

PROTOCOL_VERSION_HEADER = "MCP-Protocol-Version"
METHOD_HEADER = "Mcp-Method"
NAME_HEADER = "Mcp-Name"
PARAM_HEADER_PREFIX = "Mcp-Param-"
SESSION_HEADER = "Mcp-Session-Id"

# Which body field a method mirrors into Mcp-Name.
NAME_BEARING_METHODS: dict[str, str] = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
    # The tasks extension's methods name their task (io.modelcontextprotocol/tasks extension,
    # specification/draft/tasks.md, "Streamable HTTP: Routing Headers").
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
}

_SENTINEL_PREFIX = "=?base64?"
_SENTINEL_SUFFIX = "?="
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_MAX_SAFE_INTEGER = 2**53 - 1


def encode_header_value(value: object) -> str | None:
    """Render a body value as a header value; None means "omit the header"."""
    if value is None:
        return None
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int):
        text = str(value)
    elif isinstance(value, str):
        text = value
    else:
        return None
    if _needs_base64(text):
        return _SENTINEL_PREFIX + base64.b64encode(text.encode()).decode("ascii") + _SENTINEL_SUFFIX
    return text


def _needs_base64(text: str) -> bool:
    if text != text.strip(" \t"):
        return True
    if text.startswith(_SENTINEL_PREFIX) and text.endswith(_SENTINEL_SUFFIX):
        return True
    # Anything outside 0x20..0x7E: for ASCII text, exactly what is not printable.
    return not (text.isascii() and text.isprintable())


def decode_header_value(raw: str) -> str:
    """Undo the base64 sentinel; raises ValueError when the sentinel payload is invalid."""
    if raw.startswith(_SENTINEL_PREFIX) and raw.endswith(_SENTINEL_SUFFIX) and len(raw) >= 11:
        payload = raw[len(_SENTINEL_PREFIX) : -len(_SENTINEL_SUFFIX)]
        try:
            return base64.b64decode(payload, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise ValueError(f"invalid base64 header value: {exc}") from None
    return raw


# Names already rendered (tool, prompt and resource names repeat on almost every request):
# bounded in count and in the length of what is kept.
_RENDERED_NAMES: dict[str, str | None] = {}
_RENDERED_NAMES_MAX = 1024
_RENDERED_NAME_LENGTH_MAX = 256


def name_header_value(method: str, params: object) -> str | None:
    field = NAME_BEARING_METHODS.get(method)
    if field is None or not isinstance(params, dict):
        return None
    value = params.get(field)
    if type(value) is not str:
        return encode_header_value(value)
    if value in _RENDERED_NAMES:
        return _RENDERED_NAMES[value]
    rendered = encode_header_value(value)
    if len(value) <= _RENDERED_NAME_LENGTH_MAX:
        if len(_RENDERED_NAMES) >= _RENDERED_NAMES_MAX:
            _RENDERED_NAMES.clear()
        _RENDERED_NAMES[value] = rendered
    return rendered


@dataclass(frozen=True, slots=True)
class ParamHeader:
    """One `x-mcp-header` annotation: header suffix and the property path it mirrors."""

    name: str
    path: tuple[str, ...]
    type: str


class InvalidToolHeaders(ValueError):
    """A tool's x-mcp-header annotations break the spec's constraints."""


# Keywords holding subschemas other than `properties`: an annotation below any of them is not
# statically reachable, which makes the tool invalid.
_SCHEMA_KEYWORDS = frozenset(
    {
        "items",
        "prefixItems",
        "additionalItems",
        "contains",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "if",
        "then",
        "else",
        "additionalProperties",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
    }
)
# Keywords holding a name -> subschema map.
_SCHEMA_MAPS = frozenset({"$defs", "definitions", "patternProperties", "dependentSchemas"})


def tool_param_headers(input_schema: object) -> tuple[ParamHeader, ...]:
    """Collect a tool's `x-mcp-header` annotations, validating every one of them.

    Raises InvalidToolHeaders with the reason when any annotation is invalid: then the whole
    tool must be withheld from the client (streamable-http.mdx §Schema Extension).
    """
    found: list[ParamHeader] = []
    _walk(input_schema, (), found, reachable=True)
    seen: set[str] = set()
    for header in found:
        folded = header.name.lower()
        if folded in seen:
            raise InvalidToolHeaders(f"x-mcp-header {header.name!r} is not unique")
        seen.add(folded)
    return tuple(found)


def _walk(schema: object, path: tuple[str, ...], found: list[ParamHeader], reachable: bool) -> None:
    if isinstance(schema, list):
        for item in schema:
            _walk(item, path, found, reachable=False)
        return
    if not isinstance(schema, dict):
        return
    if "x-mcp-header" in schema:
        value = schema["x-mcp-header"]
        if not reachable or not path:
            raise InvalidToolHeaders("x-mcp-header on a property not reachable through properties")
        if not isinstance(value, str) or not value:
            raise InvalidToolHeaders("x-mcp-header must be a non-empty string")
        if not _TOKEN.fullmatch(value):
            raise InvalidToolHeaders(f"x-mcp-header {value!r} is not an HTTP token")
        kind = schema.get("type")
        if kind not in ("string", "integer", "boolean"):
            raise InvalidToolHeaders(f"x-mcp-header {value!r} on a property of type {kind!r}")
        found.append(ParamHeader(value, path, kind))
    for key, sub in schema.items():
        if key == "properties" and isinstance(sub, dict):
            for prop, prop_schema in sub.items():
                _walk(prop_schema, (*path, prop), found, reachable)
        elif key in _SCHEMA_MAPS and isinstance(sub, dict):
            for member in sub.values():
                _walk(member, path, found, reachable=False)
        elif key in _SCHEMA_KEYWORDS:
            _walk(sub, path, found, reachable=False)


def param_header_values(headers: tuple[ParamHeader, ...], arguments: object) -> dict[str, str]:
    """Header name -> encoded value for the annotated arguments present in a call."""
    out: dict[str, str] = {}
    for header in headers:
        value: Any = arguments
        for step in header.path:
            value = value.get(step) if isinstance(value, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _MAX_SAFE_INTEGER:
            continue
        encoded = encode_header_value(value)
        if encoded is not None:
            out[PARAM_HEADER_PREFIX + header.name] = encoded
    return out

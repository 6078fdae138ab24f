"""Render modern-era payloads in the shape a legacy revision defines (docs/translation.md §3.5).

Each function returns a new object when it changes something and leaves the input untouched.
Unknown fields are kept: clients ignore extra fields; unknown content-block types break them.
"""

from __future__ import annotations

from typing import Any

from .versions import LATEST_LEGACY, legacy_at_least

JSONDict = dict[str, Any]

_TOOL_FIELDS_2025_06_18 = ("title", "outputSchema", "_meta")
_ICON_FIELDS = ("icons",)
_IMPLEMENTATION_FIELDS_2025_11_25 = ("icons", "description", "websiteUrl")


def content_block(block: object, version: str) -> object:
    if not isinstance(block, dict):
        return block
    kind = block.get("type")
    if kind == "audio" and not legacy_at_least(version, "2025-03-26"):
        return {"type": "text", "text": f"[audio content ({block.get('mimeType', 'unknown type')}) omitted]"}
    if kind == "resource_link" and not legacy_at_least(version, "2025-06-18"):
        label = block.get("name") or block.get("uri")
        return {"type": "text", "text": f"[resource: {label}] {block.get('uri', '')}".rstrip()}
    if not legacy_at_least(version, "2025-11-25") and any(f in block for f in _ICON_FIELDS):
        block = {k: v for k, v in block.items() if k not in _ICON_FIELDS}
    return block


def content_list(blocks: object, version: str) -> object:
    if not isinstance(blocks, list) or version == LATEST_LEGACY:  # the latest knows every block as it is
        return blocks
    return [content_block(b, version) for b in blocks]


def implementation(info: object, version: str) -> object:
    if not isinstance(info, dict) or legacy_at_least(version, "2025-11-25"):
        return info
    return {k: v for k, v in info.items() if k not in _IMPLEMENTATION_FIELDS_2025_11_25}


def tool(definition: JSONDict, version: str) -> JSONDict:
    out = dict(definition)
    output_schema = out.get("outputSchema")
    if isinstance(output_schema, dict) and output_schema.get("type") != "object":
        out.pop("outputSchema")  # legacy requires an object root; modern loosened it
    out.pop("execution", None)  # the upstream's; hosted tasks add their own (translation.md §3.10)
    if not legacy_at_least(version, "2025-06-18"):
        for field in _TOOL_FIELDS_2025_06_18:
            out.pop(field, None)
    if not legacy_at_least(version, "2025-03-26"):
        out.pop("annotations", None)
    if not legacy_at_least(version, "2025-11-25"):
        out.pop("icons", None)
    return out


def _strip_icons(items: object, version: str) -> object:
    if not isinstance(items, list) or legacy_at_least(version, "2025-11-25"):
        return items
    return [{k: v for k, v in item.items() if k != "icons"} if isinstance(item, dict) else item for item in items]


_LISTED_FIELD = {
    "prompts/list": "prompts",
    "resources/list": "resources",
    "resources/templates/list": "resourceTemplates",
}


def result(method: str, payload: JSONDict, version: str) -> JSONDict:
    """Downgrade a method's result for a legacy session of `version`."""
    out = dict(payload)
    if method == "tools/call":
        if "content" in out:
            out["content"] = content_list(out["content"], version)
        structured = out.get("structuredContent")
        if "structuredContent" in out and (
            not isinstance(structured, dict) or not legacy_at_least(version, "2025-06-18")
        ):
            out.pop("structuredContent")
    elif method == "tools/list" and isinstance(out.get("tools"), list):
        out["tools"] = [tool(t, version) if isinstance(t, dict) else t for t in out["tools"]]
    elif method == "prompts/get" and isinstance(out.get("messages"), list):
        out["messages"] = [
            {**m, "content": content_block(m["content"], version)} if isinstance(m, dict) and "content" in m else m
            for m in out["messages"]
        ]
    else:
        field = _LISTED_FIELD.get(method)
        if field is not None and field in out:
            out[field] = _strip_icons(out[field], version)
    return out


def progress_params(params: JSONDict, version: str) -> JSONDict:
    if "message" in params and not legacy_at_least(version, "2025-03-26"):
        return {k: v for k, v in params.items() if k != "message"}
    return params


def _enum_schema_2025_06_18(schema: object) -> object:
    """SEP-1330 enum variants → the plain `enum` (+ `enumNames`) form 2025-06-18 knows."""
    if not isinstance(schema, dict):
        return schema
    one_of = schema.get("oneOf")
    if schema.get("type") == "string" and isinstance(one_of, list):
        consts = [o.get("const") for o in one_of if isinstance(o, dict)]
        titles = [o.get("title", o.get("const")) for o in one_of if isinstance(o, dict)]
        out = {k: v for k, v in schema.items() if k != "oneOf"}
        out["enum"] = consts
        out["enumNames"] = titles
        return out
    if schema.get("type") == "array":
        items = schema.get("items")
        values: list[Any] = []
        if isinstance(items, dict):
            if isinstance(items.get("enum"), list):
                values = items["enum"]
            elif isinstance(items.get("anyOf"), list):
                values = [o.get("const") for o in items["anyOf"] if isinstance(o, dict)]
        # 2025-06-18 forms have no arrays: offer a single choice among the same values.
        out = {k: v for k, v in schema.items() if k not in ("items", "minItems", "maxItems", "default")}
        out["type"] = "string"
        if values:
            out["enum"] = values
        return out
    return schema


def elicitation_params(params: JSONDict, version: str) -> JSONDict:
    """An elicitation request's params for a legacy client of `version` (form mode)."""
    if legacy_at_least(version, "2025-11-25"):
        return params
    out = {k: v for k, v in params.items() if k != "mode"}
    schema = out.get("requestedSchema")
    if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
        out["requestedSchema"] = {
            **schema,
            "properties": {name: _enum_schema_2025_06_18(prop) for name, prop in schema["properties"].items()},
        }
    return out


def elicitation_content(requested_schema: object, content: object, version: str) -> object:
    """A 2025-06-18 answer to a downgraded form, in the shape the original schema asked for.

    Multi-select fields were offered as a single choice (that revision has no arrays), so a
    single answer is wrapped back into the list the upstream expects.
    """
    if legacy_at_least(version, "2025-11-25") or not isinstance(content, dict):
        return content
    properties = requested_schema.get("properties") if isinstance(requested_schema, dict) else None
    if not isinstance(properties, dict):
        return content
    out = dict(content)
    for name, prop in properties.items():
        if isinstance(prop, dict) and prop.get("type") == "array" and name in out and not isinstance(out[name], list):
            out[name] = [out[name]]
    return out


def sampling_params(params: JSONDict, version: str) -> JSONDict:
    if legacy_at_least(version, "2025-11-25"):
        return params
    return {k: v for k, v in params.items() if k not in ("tools", "toolChoice")}

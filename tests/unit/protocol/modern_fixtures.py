"""Modern (2026-07-28) payloads as an upstream sends them, shared by the downgrade tests.

Each fixture is checked against the 2026-07-28 schema in test_downgrade so the inputs are real.
"""

from __future__ import annotations

from typing import Any

ICONS = [{"src": "https://example.com/icon.png", "mimeType": "image/png", "sizes": ["48x48"]}]

WEATHER_TOOL: dict[str, Any] = {
    "name": "weather",
    "title": "Weather",
    "description": "Current weather for a city",
    "inputSchema": {
        "type": "object",
        "properties": {"city": {"type": "string", "x-mcp-header": "City"}},
        "required": ["city"],
    },
    "outputSchema": {"type": "object", "properties": {"celsius": {"type": "number"}}},
    "annotations": {"readOnlyHint": True, "title": "Weather lookup"},
    "icons": ICONS,
    "execution": {"taskSupport": "optional"},
    "_meta": {"com.example/team": "geo"},
    "x-vendor-field": {"kept": True},
}

COUNT_TOOL: dict[str, Any] = {
    "name": "count",
    "inputSchema": {"type": "object"},
    "outputSchema": {"type": "integer"},  # modern allows any root; legacy requires an object
}

TOOLS_LIST: dict[str, Any] = {"tools": [WEATHER_TOOL, COUNT_TOOL], "nextCursor": "page-2"}

AUDIO = {"type": "audio", "data": "UklGRg==", "mimeType": "audio/wav"}
RESOURCE_LINK = {
    "type": "resource_link",
    "uri": "file:///reports/q3.pdf",
    "name": "q3.pdf",
    "mimeType": "application/pdf",
    "icons": ICONS,
}
TEXT = {"type": "text", "text": "It is sunny", "annotations": {"audience": ["user"], "priority": 0.5}}
IMAGE = {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}
EMBEDDED = {"type": "resource", "resource": {"uri": "mem://note", "mimeType": "text/plain", "text": "note"}}

TOOLS_CALL: dict[str, Any] = {
    "content": [TEXT, IMAGE, AUDIO, RESOURCE_LINK, EMBEDDED],
    "structuredContent": {"celsius": 21.5},
    "isError": False,
    "_meta": {"com.example/trace": "t-1"},
    "x-vendor-field": [1, 2],
}

MODERN_ENVELOPE = {"resultType": "complete"}
CACHE_HINTS = {"ttlMs": 60000, "cacheScope": "private"}

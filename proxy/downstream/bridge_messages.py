"""The bridge's pure parts (downstream/bridge.py): a client's bytes read as JSON-RPC, the era a
stdio or HTTP+SSE client speaks told from its first messages, the 2026-07-28 request-metadata
headers computed from a message's body, one message as one stdout line, an SSE body's messages."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from ..protocol import client_checks, jsonrpc, meta
from ..protocol.headers import METHOD_HEADER, NAME_HEADER, PROTOCOL_VERSION_HEADER, name_header_value
from ..protocol.sse import Decoder
from ..protocol.versions import MODERN_VERSIONS

LEGACY = "legacy"
MODERN = "modern"
ACCEPT = "application/json, text/event-stream"


class MessageError(Exception):
    """Bytes that are not one JSON-RPC message: `reply` is the JSON-RPC error to answer with."""

    def __init__(self, reply: dict[str, Any]) -> None:
        super().__init__(reply["error"]["message"])
        self.reply = reply


def parse_message(data: bytes, max_depth: int) -> Any:
    """One JSON-RPC message (or a batch) from a stdin line or a POST body; raises MessageError
    with the reply."""
    try:
        message = jsonrpc.decode(data)
    except jsonrpc.TooDeep:
        raise _too_deep(None, max_depth) from None
    except jsonrpc.DecodeError:
        raise MessageError(jsonrpc.error_response(None, jsonrpc.PARSE_ERROR, "Parse error: not valid JSON")) from None
    if client_checks.too_deep(message, max_depth, data):
        raise _too_deep(id_or_none(message), max_depth)
    items = message if isinstance(message, list) and message else [message]
    for item in items:
        if not isinstance(item, dict) or jsonrpc.kind(item) == "invalid":
            raise MessageError(
                jsonrpc.error_response(
                    id_or_none(item), jsonrpc.INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 message"
                )
            )
    return message


def _too_deep(request_id: Any, max_depth: int) -> MessageError:
    rejection = client_checks.depth_rejection(max_depth)
    return MessageError(jsonrpc.error_response(request_id, rejection.code, rejection.message))


def id_or_none(message: Any) -> Any:
    if isinstance(message, dict):
        value = message.get("id")
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return value
    return None


def logged_method(message: Any) -> str | None:
    method = message.get("method") if isinstance(message, dict) else None
    return method[:200] if isinstance(method, str) else None


def modern_version(message: Any) -> str | None:
    """The 2026-07-28 protocol version a request's `_meta` carries, if any."""
    if not isinstance(message, dict):
        return None
    request_meta = meta.meta_of(message.get("params"))
    version = request_meta.get(meta.PROTOCOL_VERSION) if request_meta else None
    return version if isinstance(version, str) else None


def choose_era(message: Any) -> str | None:
    """The host's era from one message, per the stdio rules: a modern host probes with
    `server/discover` or stamps its requests with `_meta` protocolVersion; a legacy host starts with
    `initialize`. None: this message does not tell."""
    if not isinstance(message, dict):
        return None
    if modern_version(message) is not None or message.get("method") == "server/discover":
        return MODERN
    if message.get("method") == "initialize":
        return LEGACY
    return None


def modern_headers(message: dict[str, Any], fallback_version: str | None = None) -> dict[str, str]:
    """The 2026-07-28 Streamable HTTP request-metadata headers for one message, from its body
    (2026-07-28/basic/transports/streamable-http.mdx §Request Metadata)."""
    headers = {"Content-Type": "application/json", "Accept": ACCEPT}
    version = modern_version(message) or fallback_version or MODERN_VERSIONS[0]
    headers[PROTOCOL_VERSION_HEADER] = version
    method = message.get("method")
    if isinstance(method, str):
        headers[METHOD_HEADER] = method
        name = name_header_value(method, message.get("params"))
        if name is not None:
            headers[NAME_HEADER] = name
    return headers


def encode_line(message: Any) -> bytes:
    """One message as one stdout line (JSON never holds a raw newline)."""
    return jsonrpc.encode(message) + b"\n"


async def sse_events(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The `data` of each SSE event of a response body, as it arrives (the core's WHATWG parser).
    An event with empty data (2025-11-25's priming event: an id to resume from) carries no message."""
    decoder = Decoder()
    async for chunk in content.iter_any():
        for event in decoder.feed(chunk):
            if event.data:
                yield event.data.encode()

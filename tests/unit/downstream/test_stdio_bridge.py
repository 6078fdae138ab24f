"""The stdio bridge's pure parts: era choice, request-metadata headers, line framing and the
replies to lines that are not JSON-RPC (proxy/downstream/bridge_messages.py, proxy/downstream/stdio.py)."""

from __future__ import annotations

from typing import Any

import pytest
from multidict import CIMultiDict

from proxy.downstream.bridge_messages import (
    LEGACY,
    MODERN,
    MessageError,
    choose_era,
    encode_line,
    modern_headers,
    parse_message,
    sse_events,
)
from proxy.downstream.stdio import LineSplitter
from proxy.protocol import jsonrpc
from proxy.protocol.modern_validate import HeaderLookup, validate_request

ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def modern(method: str, **params: object) -> dict[str, object]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": ENVELOPE}}


@pytest.mark.parametrize(
    ("message", "era"),
    [
        ({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}}, LEGACY),
        ({"jsonrpc": "2.0", "id": 1, "method": "server/discover"}, MODERN),
        (modern("tools/list"), MODERN),
        (modern("initialize"), MODERN),  # the reserved key marks a modern request, initialize or not
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, None),
        ({"jsonrpc": "2.0", "method": "notifications/initialized"}, None),
        ([1], None),
    ],
)
def test_the_first_decisive_message_chooses_the_era(message: object, era: str | None) -> None:
    assert choose_era(message) == era


@pytest.mark.parametrize(
    "message",
    [
        modern("tools/call", name="weather lookup", arguments={"city": "Zürich"}),
        modern("tools/call", name="plain", arguments={}),
        modern("prompts/get", name="greet"),
        modern("resources/read", uri="file:///tmp/ä b.txt"),
        modern("server/discover"),
        modern("subscriptions/listen", notifications={}),
    ],
)
def test_modern_headers_pass_the_endpoints_validation(message: dict[str, object]) -> None:
    headers = modern_headers(message)
    checked = validate_request(message, HeaderLookup(CIMultiDict(headers.items())))
    assert not hasattr(checked, "code"), checked
    assert headers["Accept"] == "application/json, text/event-stream"


def test_a_name_that_is_not_plain_ascii_goes_base64() -> None:
    headers = modern_headers(modern("tools/call", name="météo", arguments={}))
    assert headers["Mcp-Name"].startswith("=?base64?")


def test_a_notification_gets_the_last_version_seen() -> None:
    headers = modern_headers({"jsonrpc": "2.0", "method": "notifications/cancelled"}, "2026-07-28")
    assert headers["MCP-Protocol-Version"] == "2026-07-28"
    assert headers["Mcp-Method"] == "notifications/cancelled"


@pytest.mark.parametrize(
    ("line", "code", "request_id"),
    [
        (b"not json", jsonrpc.PARSE_ERROR, None),
        (b'{"jsonrpc": "2.0", "id": 5', jsonrpc.PARSE_ERROR, None),
        (b"42", jsonrpc.INVALID_REQUEST, None),
        (b'{"id": 3, "method": "x"}', jsonrpc.INVALID_REQUEST, 3),  # no "jsonrpc": "2.0"
        (b'{"jsonrpc": "2.0", "id": 9}', jsonrpc.INVALID_REQUEST, 9),
        (b'{"jsonrpc": "2.0", "id": 4, "method": "x", "params": ' + b"[" * 300 + b"]" * 300 + b"}", None, 4),
        (
            b'{"jsonrpc": "2.0", "id": 4, "method": "x", "params": ' + b"[" * 2000 + b"]" * 2000 + b"}",
            jsonrpc.INVALID_REQUEST,
            None,
        ),
        (b"\xff\xfe", jsonrpc.PARSE_ERROR, None),
    ],
)
def test_garbage_gets_a_jsonrpc_error(line: bytes, code: int | None, request_id: object) -> None:
    with pytest.raises(MessageError) as caught:
        parse_message(line, 64)
    reply = caught.value.reply
    assert reply["jsonrpc"] == "2.0" and reply.get("id") == request_id
    if code is not None:
        assert reply["error"]["code"] == code
    assert encode_line(reply).count(b"\n") == 1


def test_a_request_parses() -> None:
    assert parse_message(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\r', 64) == {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "ping",
    }


def test_lines_split_across_reads_and_blank_lines_skipped() -> None:
    splitter = LineSplitter(100)
    assert splitter.feed(b'{"a"') == []
    assert splitter.feed(b':1}\n\n  \n{"b":2}\r\n{"c"') == [b'{"a":1}', b'{"b":2}']
    assert splitter.end() == [b'{"c"']


def test_a_line_too_long_is_reported_once_and_reading_resumes() -> None:
    splitter = LineSplitter(10)
    assert splitter.feed(b"x" * 8) == []
    assert splitter.feed(b"x" * 8) == [None]
    assert splitter.feed(b"x" * 50) == []
    assert splitter.feed(b'xx\n{"ok":1}\n') == [b'{"ok":1}']
    assert splitter.feed(b"y" * 11 + b"\nz\n") == [None, b"z"]
    assert splitter.end() == []


def test_encoded_lines_never_hold_a_raw_newline() -> None:
    line = encode_line({"jsonrpc": "2.0", "id": 1, "result": {"text": "a\nb", "big": 2**70}})
    assert line.endswith(b"\n") and line.count(b"\n") == 1


class _Body:
    """A response body arriving in the given chunks (what sse_events reads: iter_any)."""

    def __init__(self, *chunks: bytes) -> None:
        self._chunks = chunks

    async def iter_any(self) -> Any:
        for chunk in self._chunks:
            yield chunk


async def _events(*chunks: bytes) -> list[bytes]:
    return [data async for data in sse_events(_Body(*chunks))]  # type: ignore[arg-type]


async def test_sse_events_skip_a_priming_event_and_keep_messages_split_anywhere() -> None:
    stream = b'id: 1\ndata: \n\n: keep-alive\n\nid: 2\nevent: message\ndata: {"a":\ndata: 1}\r\n\r\n'
    expected = [b'{"a":\n1}']
    assert await _events(stream) == expected
    assert await _events(*(stream[i : i + 3] for i in range(0, len(stream), 3))) == expected

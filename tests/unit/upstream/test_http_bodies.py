"""How the HTTP upstream reads a whole (not streamed) reply (proxy/upstream/http.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from multidict import CIMultiDict

from proxy.config import UpstreamConfig
from proxy.protocol import jsonrpc
from proxy.upstream.errors import UpstreamProtocolError
from proxy.upstream.http import HttpUpstream

REPLY = jsonrpc.result_response(1, {"resultType": "complete", "content": [{"type": "text", "text": "x" * 1600}]})


class ArrivingInParts:
    """A body whose parts arrive one per read, like one a server writes in two parts 200 ms apart:
    a read returns what has arrived so far (aiohttp's StreamReader.read(n) does the same)."""

    def __init__(self, *parts: bytes) -> None:
        self._parts = [part for part in parts if part]

    async def read(self, n: int = -1) -> bytes:
        if not self._parts:
            return b""
        part = self._parts[0]
        if 0 <= n < len(part):
            self._parts[0] = part[n:]
            return part[:n]
        self._parts.pop(0)
        return part

    def at_eof(self) -> bool:
        return not self._parts


class Response:
    def __init__(self, *parts: bytes, status: int = 200, length: int | None = None) -> None:
        self.status = status
        self.headers = CIMultiDict({"Content-Type": "application/json"})
        self.content_length = length
        self.content = ArrivingInParts(*parts)


def upstream(**config: Any) -> HttpUpstream:
    return HttpUpstream(UpstreamConfig(url="http://127.0.0.1:1/mcp", **config), session=None)  # type: ignore[arg-type]


async def messages(up: HttpUpstream, response: Response) -> list[Any]:
    return [message async for message in up._messages(response)]  # type: ignore[arg-type]


async def test_a_reply_that_arrives_in_two_reads_is_read_whole() -> None:
    """The body was read with one read of 64 KiB: the first part alone is not JSON (-32012)."""
    raw = json.dumps(REPLY).encode()
    assert len(raw) > 1600
    assert await messages(upstream(), Response(raw[:700], raw[700:])) == [REPLY]


async def test_a_reply_of_many_small_reads_is_read_whole() -> None:
    raw = json.dumps(REPLY).encode()
    parts = [raw[i : i + 10] for i in range(0, len(raw), 10)]
    assert await messages(upstream(), Response(*parts)) == [REPLY]


@pytest.mark.parametrize("announced", [True, False], ids=["content-length", "chunked"])
async def test_a_reply_over_max_reply_bytes_fails_naming_the_bound(announced: bool) -> None:
    raw = json.dumps(REPLY).encode()
    response = Response(raw[:1000], raw[1000:], length=len(raw) if announced else None)
    with pytest.raises(UpstreamProtocolError, match=r"upstream\.max_reply_bytes \(1000 bytes\)"):
        await messages(upstream(max_reply_bytes=1000), response)


async def test_a_reply_exactly_max_reply_bytes_long_is_read() -> None:
    raw = json.dumps(REPLY).encode()
    assert await messages(upstream(max_reply_bytes=len(raw)), Response(raw[:5], raw[5:])) == [REPLY]

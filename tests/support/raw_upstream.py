"""The byte-scripted upstream, for the replies no well-behaved server sends.

`RawUpstream` is an upstream on 127.0.0.1 that writes exactly what a test scripts, byte by byte: a
stream that breaks in the middle of a chunk, a body in two parts, an HTML error page. What the proxy
makes of it is read with the raw HTTP client (tests/support/raw_http_client.py, `raw_exchange`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

JSONDict = dict[str, Any]


@dataclass
class RawRequest:
    method: str
    path: str
    headers: dict[str, str]  # names lowercased
    body: bytes

    @property
    def message(self) -> Any:
        return json.loads(self.body) if self.body else None


Script = Callable[[RawRequest, asyncio.StreamWriter], Awaitable[None]]


def head(status: int, content_type: str | None, *, length: int | None = None, extra: str = "") -> bytes:
    """A response head: chunked unless `length` is given; the connection closes after the reply."""
    lines = [f"HTTP/1.1 {status} Scripted"]
    if content_type is not None:
        lines.append(f"Content-Type: {content_type}")
    lines.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
    lines.append("Connection: close")
    if extra:
        lines.append(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


LAST_CHUNK = b"0\r\n\r\n"


def sse(message: JSONDict) -> bytes:
    return b"data: " + json.dumps(message).encode() + b"\n\n"


def whole(status: int, content_type: str | None, body: bytes, extra: str = "") -> Script:
    """A script that answers one complete reply with a Content-Length."""

    async def script(request: RawRequest, writer: asyncio.StreamWriter) -> None:
        writer.write(head(status, content_type, length=len(body), extra=extra) + body)

    return script


class RawUpstream:
    def __init__(self) -> None:
        self.requests: list[RawRequest] = []
        self.script: Script = whole(500, "text/plain", b"no script")
        self.release = asyncio.Event()  # scripts that hang wait for this (set at stop)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.release.set()
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            request = await _read_request(reader)
            if request is None:
                return
            self.requests.append(request)
            await self.script(request, writer)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            self._writers.discard(writer)
            writer.close()


async def _read_request(reader: asyncio.StreamReader) -> RawRequest | None:
    try:
        raw_head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    request_line, *header_lines = raw_head.decode("latin-1").split("\r\n")
    method, path, _ = request_line.split(" ", 2)
    headers: dict[str, str] = {}
    for line in header_lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return RawRequest(method, path, headers, body)

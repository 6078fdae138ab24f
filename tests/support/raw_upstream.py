"""HTTP/1.1 written and read byte by byte, for the replies no well-behaved server or client sends.

`RawUpstream` is an upstream on 127.0.0.1 that writes exactly what a test scripts: a stream that
breaks in the middle of a chunk, a body in two parts, an HTML error page. `raw_exchange` is a
keep-alive client that records every byte the proxy sends back until the proxy closes the
connection (bounded by a timeout), so a test can tell one reply from two and see the close.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
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


@dataclass
class RawReply:
    """What one keep-alive POST got back: its head and body, every byte that followed them (a
    second response would be there), and whether the proxy closed the connection."""

    head: str
    body: bytes
    complete: bool  # the body ended as its framing says (not cut off)
    after: bytes = b""
    closed: bool = False
    events: list[JSONDict] = field(default_factory=list)

    @property
    def status(self) -> int:
        return int(self.head.split(" ", 2)[1])

    @property
    def data(self) -> bytes:
        return self.head.encode("latin-1") + b"\r\n\r\n" + self.body + self.after


async def raw_exchange(
    host: str,
    port: int,
    body: bytes,
    headers: dict[str, str],
    *,
    wait_s: float,
    until_close: bool = False,
    path: str = "/mcp",
) -> RawReply:
    """POST `body` on a kept-alive connection and read the reply; `until_close`: then read on until
    the proxy closes the connection (`closed` stays False if it has not within `wait_s`)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: keep-alive"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        lines.append(f"Content-Length: {len(body)}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        await writer.drain()
        async with asyncio.timeout(wait_s):
            reply = await _read_reply(reader)
        if until_close and reply.complete:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    reply.after = await reader.read()  # to EOF
                    reply.closed = True
        elif not reply.complete:
            reply.closed = reader.at_eof()
    finally:
        writer.close()
    if "text/event-stream" in reply.head.lower():
        reply.events = _events(reply.body)
    return reply


def _events(body: bytes) -> list[JSONDict]:
    """The JSON-RPC messages of the whole events in an SSE body (an unterminated last one is not)."""
    events = []
    for block in body.replace(b"\r\n", b"\n").split(b"\n\n")[:-1]:
        data = [line[5:].removeprefix(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
        if b"".join(data).strip():
            events.append(json.loads(b"\n".join(data)))
    return events


async def _read_reply(reader: asyncio.StreamReader) -> RawReply:
    head = (await reader.readuntil(b"\r\n\r\n"))[:-4].decode("latin-1")
    lowered = head.lower()
    length = next(
        (int(line.split(":", 1)[1]) for line in lowered.split("\r\n") if line.startswith("content-length:")), None
    )
    if "transfer-encoding: chunked" in lowered:
        body = bytearray()
        try:
            while True:
                size_line = await reader.readuntil(b"\r\n")
                try:
                    size = int(size_line.split(b";")[0], 16)
                except ValueError:  # not a chunk: whatever came instead (another response?)
                    return RawReply(head, bytes(body), complete=False, after=size_line + reader._buffer)
                if size == 0:
                    break
                body += await reader.readexactly(size)
                await reader.readexactly(2)
            await reader.readuntil(b"\r\n")  # the empty trailer
        except asyncio.IncompleteReadError as exc:
            return RawReply(head, bytes(body) + exc.partial, complete=False)
        return RawReply(head, bytes(body), complete=True)
    if length is not None:
        try:
            return RawReply(head, await reader.readexactly(length), complete=True)
        except asyncio.IncompleteReadError as exc:
            return RawReply(head, exc.partial, complete=False)
    return RawReply(head, await reader.read(), complete=True)  # delimited by the close

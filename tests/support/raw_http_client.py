"""The raw HTTP client: HTTP/1.1 by hand, for input no well-behaved client library would send (any
header bytes, any body, any framing) and for seeing exactly what came back: the head, the body as its
framing delimits it, every byte after it (a second response would be there), and whether the server
closed the connection. Every exchange is bounded by a deadline and reads the reply to its end.

`exchange` blocks (for tests beside a proxy process); `raw_exchange` runs it in a thread, for tests
whose proxy runs on their own event loop, and reports a cut-off reply instead of failing on it."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class Hung(AssertionError):
    """The server did not finish its reply within the deadline."""


@dataclass
class Reply:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    raw_head: bytes = b""
    closed: bool = True  # the server closed the connection after the reply
    elapsed_s: float = 0.0
    trailing: bytes = field(default=b"")  # bytes after the end of a framed body (should be none)
    complete: bool = True  # the body ended as its framing says (not cut off)

    def header(self, name: str) -> str | None:
        lowered = name.lower()
        for key, value in self.headers:
            if key.lower() == lowered:
                return value
        return None

    @property
    def content_type(self) -> str:
        return (self.header("content-type") or "").split(";")[0].strip().lower()

    @property
    def head(self) -> str:
        return self.raw_head.decode("latin-1")

    @property
    def after(self) -> bytes:
        return self.trailing

    @property
    def data(self) -> bytes:
        """Every byte of the reply and after it, as read (a chunked body without its framing)."""
        return self.raw_head + b"\r\n\r\n" + self.body + self.trailing

    @property
    def events(self) -> list[dict[str, Any]]:
        """The JSON-RPC messages of the whole events of an SSE body (an unterminated last one is not)."""
        if self.content_type != "text/event-stream":
            return []
        events = []
        for block in self.body.replace(b"\r\n", b"\n").split(b"\n\n")[:-1]:
            data = [line[5:].removeprefix(b" ") for line in block.split(b"\n") if line.startswith(b"data:")]
            if b"".join(data).strip():
                events.append(json.loads(b"\n".join(data)))
        return events


def build(
    method: str,
    path: str,
    headers: list[tuple[str, bytes | str]],
    body: bytes = b"",
    *,
    host: str = "127.0.0.1",
    keep_alive: bool = False,
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: " + host.encode()]
    if not keep_alive:
        lines.append(b"Connection: close")
    for name, value in headers:
        lines.append(name.encode("latin-1") + b": " + (value.encode() if isinstance(value, str) else value))
    if body or method == "POST":
        lines.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def exchange(
    port: int,
    request: bytes,
    *,
    timeout: float = 20.0,
    when: tuple[bytes, Callable[[], None]] | None = None,
    linger_s: float | None = None,
    cut_off_ok: bool = False,
) -> Reply:
    """Send `request` to 127.0.0.1:`port`; read one whole reply (to EOF or its framed end).

    The write side stays open: aiohttp reads a half-closed connection as a client gone. `when`:
    (marker, action): run `action` once the bytes read so far hold `marker` (e.g. kill a server
    once the reply shows the call under way). After the reply, the bytes that follow are read for
    `linger_s` (up to 2 s by default) or until the server closes the connection. `cut_off_ok`: a
    body cut off or broken in its framing gives a reply that is not `complete` instead of failing."""
    started = time.monotonic()
    deadline = started + timeout
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        reader = _Reader(sock, deadline, when)
        head = reader.until(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        status = int(parts[1])
        reason = parts[2] if len(parts) > 2 else ""
        headers = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in header_lines if line)]
        reply = Reply(status, reason, headers, b"", head)
        try:
            if reply.header("transfer-encoding") == "chunked":
                reply.body = reader.chunked()
            elif (length := reply.header("content-length")) is not None:
                reply.body = reader.exactly(int(length))
            else:
                reply.body = reader.rest()
        except ConnectionError:  # cut off: the body is what came
            if not cut_off_ok:
                raise
            reply.body, reply.complete, reply.closed = bytes(reader.body) + reader.buffer, False, True
            reply.elapsed_s = time.monotonic() - started
            return reply
        except BrokenFraming:  # what came instead of the next chunk stays after the body
            if not cut_off_ok:
                raise
            reply.body, reply.complete, reply.closed = bytes(reader.body), False, reader.eof
            reply.trailing = reader.buffer
            reply.elapsed_s = time.monotonic() - started
            return reply
        linger = min(deadline, time.monotonic() + 2.0) if linger_s is None else time.monotonic() + linger_s
        reply.closed = reader.at_eof(linger)
        reply.trailing = reader.buffer
        reply.elapsed_s = time.monotonic() - started
        return reply


async def raw_exchange(
    host: str,
    port: int,
    body: bytes,
    headers: dict[str, str],
    *,
    wait_s: float,
    until_close: bool = False,
    path: str = "/mcp",
) -> Reply:
    """POST `body` on a kept-alive connection and read the reply; `until_close`: then read on until
    the server closes the connection (`closed` stays False if it has not within `wait_s`)."""
    request = build("POST", path, list(headers.items()), body, host=f"{host}:{port}", keep_alive=True)
    linger_s = wait_s if until_close else 0.0
    return await asyncio.to_thread(exchange, port, request, timeout=wait_s, linger_s=linger_s, cut_off_ok=True)


class BrokenFraming(AssertionError):
    """A chunked body whose next chunk-size line is not one (another response, or garbage)."""


class _Reader:
    def __init__(self, sock: socket.socket, deadline: float, when: tuple[bytes, Callable[[], None]] | None) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buffer = b""
        self.body = bytearray()  # a chunked body read so far
        self.eof = False
        self._when = when
        self._seen = b""

    def _more(self, deadline: float | None = None) -> bool:
        remaining = (deadline or self.deadline) - time.monotonic()
        if remaining <= 0:
            if deadline is not None:
                return False
            raise Hung(f"no end of reply within the deadline; read so far: {self.buffer[:300]!r}")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            if deadline is not None:
                return False
            raise Hung(f"no end of reply within the deadline; read so far: {self.buffer[:300]!r}") from None
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.buffer += data
        if self._when is not None:
            self._seen += data
            marker, action = self._when
            if marker in self._seen:
                self._when = None
                action()
        return True

    def until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            if not self._more():
                raise ConnectionError(f"connection closed before {marker!r}; got {self.buffer[:300]!r}")
        head, _, self.buffer = self.buffer.partition(marker)
        return head

    def exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            if not self._more():
                raise ConnectionError(f"connection closed after {len(self.buffer)} of {n} body bytes")
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def chunked(self) -> bytes:
        while True:
            size_line = self.until(b"\r\n")
            try:
                size = int(size_line.split(b";")[0], 16)
            except ValueError:
                self.buffer = size_line + b"\r\n" + self.buffer
                raise BrokenFraming(
                    f"broken chunked framing at {size_line[:120]!r} after {bytes(self.body[-200:])!r}"
                ) from None
            if size == 0:
                self.until(b"\r\n")  # no trailers are expected: the blank line
                return bytes(self.body)
            self.body += self.exactly(size)
            self.exactly(2)

    def rest(self) -> bytes:
        while self._more():
            pass
        out, self.buffer = self.buffer, b""
        return out

    def at_eof(self, deadline: float) -> bool:
        while not self.eof:
            if not self._more(deadline):
                return self.eof
        return True

"""The proxy as a host's stdio server: newline-delimited JSON-RPC on stdin/stdout, bridged to the
proxy's own Streamable HTTP endpoint on a private listener (downstream/bridge.py).

Spec: 2025-11-25 and 2026-07-28 basic/transports.mdx §stdio (one JSON-RPC message per line, no
embedded newlines, nothing but MCP on stdout, logs on stderr). Garbage on stdin gets a JSON-RPC
error and the bridge keeps reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from typing import Any

import structlog

from ..protocol import jsonrpc
from .bridge import EndpointBridge
from .bridge_messages import encode_line

log = structlog.get_logger(__name__)

_READ_CHUNK = 65536


class LineSplitter:
    """Splits a byte stream into lines, at most `limit` bytes each: a longer line is dropped
    (`feed` yields None for it once) and reading resumes at the next newline."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._skipping = False

    def feed(self, data: bytes) -> list[bytes | None]:
        out: list[bytes | None] = []
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            piece = data[start:end]
            if self._skipping:
                self._skipping = False
            elif len(self._buffer) + len(piece) > self._limit:
                out.append(None)
            else:
                self._buffer += piece
                line = bytes(self._buffer).rstrip(b"\r")
                if line.strip():
                    out.append(line)
            self._buffer.clear()
            start = end + 1
        rest = data[start:]
        if not self._skipping:
            if len(self._buffer) + len(rest) > self._limit:
                self._buffer.clear()
                self._skipping = True
                out.append(None)
            else:
                self._buffer += rest
        return out

    def end(self) -> list[bytes | None]:
        """At EOF: the last line without a newline, if any."""
        if self._skipping or not bytes(self._buffer).strip():
            return []
        line = bytes(self._buffer)
        self._buffer.clear()
        return [line]


class StdinReader:
    """Reads fd 0 in a thread of its own (os.read, no buffered lock to leave held at exit), and
    hands lines to the loop; None for a line too long, then EOF as a final `eof` call."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int, fd: int = 0) -> None:
        self._loop = loop
        self._fd = fd
        self._splitter = LineSplitter(limit)
        self.queue: asyncio.Queue[bytes | EOFError | None] = asyncio.Queue()

    def start(self) -> None:
        threading.Thread(target=self._run, name="stdin", daemon=True).start()

    def _put(self, item: bytes | EOFError | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads any more
            self._loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def _run(self) -> None:
        while True:
            try:
                data = os.read(self._fd, _READ_CHUNK)
            except InterruptedError:
                continue
            except OSError:
                data = b""
            if not data:
                for line in self._splitter.end():
                    self._put(line)
                self._put(EOFError())
                return
            for line in self._splitter.feed(data):
                self._put(line)


class StdoutWriter:
    """The one writer of stdout: lines in the order they were queued, each flushed."""

    def __init__(self, fd: int = 1) -> None:
        self._fd = fd
        self._queue: asyncio.Queue[bytes] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._unwritten = 0  # lines queued or being written
        self.broken = asyncio.Event()  # the host no longer reads

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="stdout")

    def write(self, message: Any) -> None:
        self._unwritten += 1
        self._queue.put_nowait(encode_line(message))

    def write_raw(self, data: bytes) -> None:
        """A message already encoded by the endpoint: validated and re-encoded as one line."""
        try:
            message = jsonrpc.decode(data)
        except jsonrpc.DecodeError:
            log.warning("stdio_unreadable_event", size=len(data))
            return
        self.write(message)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            line = await self._queue.get()
            try:
                await loop.run_in_executor(None, self._write_all, line)
            except OSError:
                self.broken.set()
                return
            finally:
                self._unwritten -= 1

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    async def drain(self, within_s: float) -> None:
        """Wait (bounded) until everything queued is written."""
        deadline = asyncio.get_running_loop().time() + within_s
        while self._unwritten > 0 and not self.broken.is_set():
            if asyncio.get_running_loop().time() > deadline:
                return
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def serve_lines(bridge: EndpointBridge, reader: StdinReader, writer: StdoutWriter, stop: asyncio.Event) -> None:
    """Feed stdin's lines to the bridge until stdin ends, stdout breaks or `stop` is set."""
    bridge.start()
    reader.start()
    stopped = asyncio.create_task(stop.wait())
    broken = asyncio.create_task(writer.broken.wait())
    try:
        while True:
            got = asyncio.create_task(reader.queue.get())
            done, _ = await asyncio.wait({got, stopped, broken}, return_when=asyncio.FIRST_COMPLETED)
            if got not in done:
                got.cancel()
                log.info("stdio_stopping", reason="signal" if stopped in done else "stdout_closed")
                return
            item = got.result()
            if isinstance(item, EOFError):
                log.info("stdio_stopping", reason="stdin_closed")
                return
            bridge.line(item)
    finally:
        stopped.cancel()
        broken.cancel()

"""The proxy as a host's stdio server: newline-delimited JSON-RPC on stdin/stdout, bridged to the
proxy's own Streamable HTTP endpoint on a private listener.

Spec: 2025-11-25 and 2026-07-28 basic/transports.mdx §stdio (one JSON-RPC message per line, no
embedded newlines, nothing but MCP on stdout, logs on stderr). The bridge behaves as one HTTP
client of the endpoint would, so every translation the HTTP side does serves stdio hosts too:

- a legacy host (its first message `initialize`): POST initialize, keep Mcp-Session-Id and the
  negotiated version, open the GET stream after `notifications/initialized` (server-to-client
  requests and notifications), POST every later message, the host's answers included;
- a modern host (`server/discover`, or any request carrying the 2026-07-28 `_meta` protocol
  version): each request its own POST with the request-metadata headers computed from its body;
  `notifications/cancelled` closes that request's POST, which is how HTTP cancels.

Requests run concurrently; one writer puts every reply, notification and server request on stdout
as a single line. Garbage on stdin gets a JSON-RPC error and the bridge keeps reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import structlog

from ..protocol import client_checks, jsonrpc, meta
from ..protocol.headers import (
    METHOD_HEADER,
    NAME_HEADER,
    PROTOCOL_VERSION_HEADER,
    SESSION_HEADER,
    name_header_value,
)
from ..protocol.versions import MODERN_VERSIONS

log = structlog.get_logger(__name__)

LEGACY = "legacy"
MODERN = "modern"
_ACCEPT = "application/json, text/event-stream"
_READ_CHUNK = 65536


# ------------------------------------------------------------ pure parts


class LineError(Exception):
    """A line that is not one JSON-RPC message: `reply` is the JSON-RPC error to write."""

    def __init__(self, reply: dict[str, Any]) -> None:
        super().__init__(reply["error"]["message"])
        self.reply = reply


def parse_line(line: bytes, max_depth: int) -> Any:
    """One stdin line as a JSON-RPC message (or a batch); raises LineError with the reply."""
    try:
        message = jsonrpc.decode(line)
    except jsonrpc.DecodeError:
        raise LineError(jsonrpc.error_response(None, jsonrpc.PARSE_ERROR, "Parse error: not valid JSON")) from None
    if client_checks.too_deep(message, max_depth, line):
        rejection = client_checks.depth_rejection(max_depth)
        raise LineError(jsonrpc.error_response(_id_or_none(message), rejection.code, rejection.message))
    items = message if isinstance(message, list) and message else [message]
    for item in items:
        if not isinstance(item, dict) or jsonrpc.kind(item) == "invalid":
            raise LineError(
                jsonrpc.error_response(
                    _id_or_none(item), jsonrpc.INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 message"
                )
            )
    return message


def _id_or_none(message: Any) -> Any:
    if isinstance(message, dict):
        value = message.get("id")
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return value
    return None


def _method_of(message: Any) -> str | None:
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
    headers = {"Content-Type": "application/json", "Accept": _ACCEPT}
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


async def sse_events(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The `data` of each SSE event of a response body, as it arrives."""
    data: list[bytes] = []
    async for raw in content:
        line = raw.rstrip(b"\r\n")
        if not line:
            if data:
                yield b"\n".join(data)
                data = []
            continue
        if line.startswith(b":"):
            continue
        field, _, value = line.partition(b":")
        if field == b"data":
            data.append(value[1:] if value.startswith(b" ") else value)
    if data:
        yield b"\n".join(data)


# ------------------------------------------------------------ the bridge


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


class StdioBridge:
    """Reads messages from `reader`, serves them through the endpoint at `url`, writes to `writer`."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        reader: StdinReader,
        writer: StdoutWriter,
        max_depth: int,
    ) -> None:
        self._http = session
        self._url = url
        self._reader = reader
        self._writer = writer
        self._max_depth = max_depth
        self.era: str | None = None
        self._session_id: str | None = None
        self._legacy_version: str | None = None
        self._modern_version: str | None = None
        self._initialized = asyncio.Event()  # legacy: the initialize exchange is over
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight: dict[Any, asyncio.Task[None]] = {}  # request id -> its POST
        self._stream: asyncio.Task[None] | None = None  # legacy GET stream

    async def run(self, stop: asyncio.Event) -> None:
        """Until stdin ends, stdout breaks or `stop` is set."""
        self._writer.start()
        self._reader.start()
        stopped = asyncio.create_task(stop.wait())
        broken = asyncio.create_task(self._writer.broken.wait())
        try:
            while True:
                got = asyncio.create_task(self._reader.queue.get())
                done, _ = await asyncio.wait({got, stopped, broken}, return_when=asyncio.FIRST_COMPLETED)
                if got not in done:
                    got.cancel()
                    log.info("stdio_stopping", reason="signal" if stopped in done else "stdout_closed")
                    return
                item = got.result()
                if isinstance(item, EOFError):
                    log.info("stdio_stopping", reason="stdin_closed")
                    return
                self._line(item)
        finally:
            stopped.cancel()
            broken.cancel()

    async def close(self, grace_s: float = 1.0) -> None:
        """Let the requests in flight finish for up to `grace_s` (a host that wrote its last
        request and closed stdin still gets the answer), unless stdout is gone; then cancel what
        is left, write what is queued (bounded) and stop the writer."""
        if self._stream is not None:
            self._stream.cancel()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        broken = asyncio.create_task(self._writer.broken.wait())
        while self._tasks and not broken.done() and (left := deadline - loop.time()) > 0:
            await asyncio.wait([*self._tasks, broken], timeout=left, return_when=asyncio.FIRST_COMPLETED)
        broken.cancel()
        pending = [*self._tasks, *([self._stream] if self._stream else [])]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=grace_s)
        await self._writer.drain(grace_s)
        await self._writer.close()

    # ------------------------------------------------------------ dispatch

    def _line(self, line: bytes | None) -> None:
        if line is None:
            self._writer.write(jsonrpc.error_response(None, jsonrpc.INVALID_REQUEST, "Invalid Request: line too long"))
            return
        try:
            message = parse_line(line, self._max_depth)
        except LineError as exc:
            log.info("stdio_bad_line", error=str(exc), size=len(line))
            self._writer.write(exc.reply)
            return
        if self.era is None:
            self.era = choose_era(message[0] if isinstance(message, list) and message else message)
            if self.era is None:
                request_id = _id_or_none(message)
                if isinstance(message, dict) and jsonrpc.kind(message) == "request":
                    self._writer.write(
                        jsonrpc.error_response(
                            request_id,
                            jsonrpc.INVALID_REQUEST,
                            "Invalid Request: send initialize (2025-era) or server/discover (2026-07-28) first",
                        )
                    )
                return
            log.info("stdio_client_era", era=self.era)
        if self.era == MODERN:
            self._modern(message)
        else:
            self._legacy(message)

    def _spawn(self, coro: Any, request_id: Any = None) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if request_id is not None:
            self._in_flight[request_id] = task
            task.add_done_callback(
                lambda _t: self._in_flight.pop(request_id, None) if self._in_flight.get(request_id) is _t else None
            )
        return task

    # ------------------------------------------------------------ modern hosts

    def _modern(self, message: Any) -> None:
        if not isinstance(message, dict):
            self._writer.write(
                jsonrpc.error_response(
                    None, jsonrpc.INVALID_REQUEST, "Invalid Request: batches are not part of 2026-07-28"
                )
            )
            return
        kind = jsonrpc.kind(message)
        if kind == "request":
            version = modern_version(message)
            if version is not None:
                self._modern_version = version
            self._spawn(self._post(message, modern_headers(message, self._modern_version)), message["id"])
        elif kind == "notification":
            if message.get("method") == "notifications/cancelled":
                self._cancel(message)
            # Over HTTP a modern notification has nothing to act on at the endpoint; sent anyway.
            self._spawn(self._post(message, modern_headers(message, self._modern_version)))
        else:
            log.info("stdio_unexpected_response", id=message.get("id"))

    def _cancel(self, message: dict[str, Any]) -> None:
        params = message.get("params")
        request_id = params.get("requestId") if isinstance(params, dict) else None
        task = self._in_flight.get(request_id)
        if task is not None:
            log.info("stdio_cancelled", id=request_id)
            task.cancel()  # closes its POST: the endpoint cancels the call upstream

    # ------------------------------------------------------------ legacy hosts

    def _legacy(self, message: Any) -> None:
        if isinstance(message, dict) and message.get("method") == "initialize" and jsonrpc.kind(message) == "request":
            self._initialized.clear()
            self._spawn(self._initialize(message), message["id"])
            return
        request_id = message.get("id") if isinstance(message, dict) and jsonrpc.kind(message) == "request" else None
        self._spawn(self._legacy_post(message), request_id)

    def _legacy_headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": _ACCEPT}
        if self._session_id is not None:
            headers[SESSION_HEADER] = self._session_id
        if self._legacy_version is not None:
            headers[PROTOCOL_VERSION_HEADER] = self._legacy_version
        return headers

    async def _initialize(self, message: dict[str, Any]) -> None:
        try:

            async def seen(response: aiohttp.ClientResponse) -> None:
                session_id = response.headers.get(SESSION_HEADER)
                if session_id:
                    self._session_id = session_id

            def on_message(reply: Any) -> None:
                if isinstance(reply, dict) and reply.get("id") == message["id"]:
                    result = reply.get("result")
                    version = result.get("protocolVersion") if isinstance(result, dict) else None
                    if isinstance(version, str):
                        self._legacy_version = version

            await self._post(message, {"Content-Type": "application/json", "Accept": _ACCEPT}, seen, on_message)
        finally:
            self._initialized.set()

    async def _legacy_post(self, message: Any) -> None:
        await self._initialized.wait()
        await self._post(message, self._legacy_headers())
        if (
            isinstance(message, dict)
            and message.get("method") == "notifications/initialized"
            and self._session_id is not None
            and self._stream is None
        ):
            self._stream = asyncio.create_task(self._listen(), name="get-stream")

    async def _listen(self) -> None:
        """The session's GET stream: server requests and notifications, reopened if it ends."""
        delay = 0.1
        while True:
            try:
                async with self._http.get(
                    self._url, headers={**self._legacy_headers(), "Accept": "text/event-stream"}, timeout=_NO_TIMEOUT
                ) as response:
                    if response.status in (404, 405):
                        log.info("stdio_no_get_stream", status=response.status)
                        return
                    if response.status != 200:
                        raise aiohttp.ClientResponseError(response.request_info, (), status=response.status)
                    delay = 0.1
                    async for data in sse_events(response.content):
                        self._writer.write_raw(data)
            except (TimeoutError, aiohttp.ClientError) as exc:
                log.info("stdio_get_stream_lost", error=str(exc))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    # ------------------------------------------------------------ one POST

    async def _post(
        self,
        message: Any,
        headers: dict[str, str],
        on_response: Callable[[aiohttp.ClientResponse], Any] | None = None,
        on_message: Callable[[Any], None] | None = None,
    ) -> None:
        """POST one message; every JSON-RPC message of the reply (JSON or SSE) goes to stdout."""
        request_id = _id_or_none(message) if isinstance(message, dict) and "method" in message else None
        expects_reply = isinstance(message, list) or (isinstance(message, dict) and jsonrpc.kind(message) == "request")
        try:
            async with self._http.post(
                self._url, data=encode_line(message)[:-1], headers=headers, timeout=_NO_TIMEOUT
            ) as response:
                if on_response is not None:
                    await on_response(response)
                content_type = response.headers.get("Content-Type", "")
                if not expects_reply:  # a notification or an answer: nothing goes back to the host
                    if response.status >= 300:
                        log.info("stdio_message_refused", status=response.status, method=_method_of(message))
                    return
                if response.status == 202:
                    return
                if content_type.startswith("text/event-stream"):
                    async for data in sse_events(response.content):
                        self._emit(data, on_message)
                    return
                body = await response.read()
                if content_type.startswith("application/json") and body:
                    self._emit(body, on_message)
                    return
                if expects_reply:
                    self._writer.write(
                        jsonrpc.error_response(
                            request_id, jsonrpc.INTERNAL_ERROR, f"the proxy answered HTTP {response.status}"
                        )
                    )
        except asyncio.CancelledError:
            raise
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.warning("stdio_post_failed", error=str(exc))
            if expects_reply and request_id is not None:
                self._writer.write(
                    jsonrpc.error_response(request_id, jsonrpc.INTERNAL_ERROR, "the proxy could not serve the request")
                )

    def _emit(self, data: bytes, on_message: Callable[[Any], None] | None) -> None:
        try:
            message = jsonrpc.decode(data)
        except jsonrpc.DecodeError:
            log.warning("stdio_unreadable_reply", size=len(data))
            return
        if on_message is not None:
            on_message(message)
        if isinstance(message, list) and not message:
            return
        self._writer.write(message)


_NO_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_read=None)

"""A client of a transport the proxy's endpoint does not speak itself (a stdio host, a 2024-11-05
HTTP+SSE client), served through that endpoint: the bridge behaves as one Streamable HTTP client of
it would, so every translation the HTTP side does serves those clients too.

- a legacy client (its first message `initialize`): POST initialize, keep Mcp-Session-Id and the
  negotiated version, open the GET stream after `notifications/initialized` (server-to-client
  requests and notifications), POST every later message, the client's answers included;
- a modern client (`server/discover`, or any request carrying the 2026-07-28 `_meta` protocol
  version): each request its own POST with the request-metadata headers computed from its body;
  `notifications/cancelled` closes that request's POST, which is how HTTP cancels.

Requests run concurrently; every reply, notification and server request goes to one writer (a
MessageSink), in the order it arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import aiohttp
import structlog

from ..protocol import client_checks, jsonrpc
from ..protocol.headers import PROTOCOL_VERSION_HEADER, SESSION_HEADER
from .bridge_messages import (
    ACCEPT,
    LEGACY,
    MODERN,
    MessageError,
    choose_era,
    encode_line,
    id_or_none,
    logged_method,
    modern_headers,
    modern_version,
    parse_message,
    sse_events,
)
from .bridge_tools import BridgeToolHeaders

log = structlog.get_logger(__name__)


class MessageSink(Protocol):
    """Where the bridge puts what the endpoint sends the client: stdout, or an SSE stream."""

    broken: asyncio.Event  # set once the client no longer reads

    def start(self) -> None: ...

    def write(self, message: Any) -> None: ...

    def write_raw(self, data: bytes) -> None: ...

    async def drain(self, within_s: float) -> None: ...

    async def close(self) -> None: ...


class EndpointBridge:
    """One client of a transport the endpoint does not speak itself, served by the proxy's own
    Streamable HTTP endpoint at `url` (over `session`): messages come in through `feed` (or `line`),
    and every message the endpoint sends back goes to `writer`."""

    def __init__(
        self, session: aiohttp.ClientSession, url: str, writer: MessageSink, max_depth: int, *, upstream: str
    ) -> None:
        """`upstream`: the name of the proxy's upstream, for the log lines."""
        self._http = session
        self._url = url
        self._writer = writer
        self._max_depth = max_depth
        # The client's own headers for the message in hand (its Authorization, trace context):
        # what the endpoint would have seen had the client posted to it.
        self._caller_headers: dict[str, str] = {}
        self.era: str | None = None
        self._session_id: str | None = None
        self._legacy_version: str | None = None
        self._modern_version: str | None = None
        self._initialized = asyncio.Event()  # legacy: the initialize exchange is over
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight: dict[Any, asyncio.Task[None]] = {}  # request id -> its POST
        # Requests a legacy host cancelled: their replies, should any still come, are not its to
        # get ("the receiver SHOULD NOT send a response", 2025-11-25/basic/utilities/cancellation).
        self._cancelled: OrderedDict[Any, None] = OrderedDict()
        self._stream: asyncio.Task[None] | None = None  # legacy GET stream
        # Set once that stream is answered (the proxy answers it once what feeds it listens): what
        # the host sends after `notifications/initialized` waits for it (bounded), so a change the
        # host makes at once is not said before anyone listens.
        self._stream_ready: asyncio.Event | None = None
        self._tools = BridgeToolHeaders(upstream)  # modern: the Mcp-Param-* headers of each tool's calls

    def start(self) -> None:
        self._writer.start()

    async def close(self, grace_s: float = 1.0, end_session: bool = False) -> None:
        """Let the requests in flight finish for up to `grace_s` (a host that wrote its last
        request and closed stdin still gets the answer), unless the client no longer reads; then
        cancel what is left, write what is queued (bounded) and stop the writer. `end_session`:
        a legacy client's session is over with its transport, and is ended at the endpoint
        (DELETE) rather than left to expire."""
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
        if end_session and self.era == LEGACY and self._session_id is not None:
            try:
                async with self._http.delete(
                    self._url, headers=self._legacy_headers(), timeout=aiohttp.ClientTimeout(total=grace_s)
                ):
                    pass
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                log.info("bridge_session_not_ended", error=str(exc) or type(exc).__name__)

    # ------------------------------------------------------------ dispatch

    def line(self, line: bytes | None) -> None:
        """One stdin line (None: one too long); what is not JSON-RPC gets its error written."""
        if line is None:
            self._writer.write(jsonrpc.error_response(None, jsonrpc.INVALID_REQUEST, "Invalid Request: line too long"))
            return
        try:
            message = parse_message(line, self._max_depth)
        except MessageError as exc:
            log.info("stdio_bad_line", error=str(exc), size=len(line))
            self._writer.write(exc.reply)
            return
        self.feed(message)

    def feed_headers(self, caller_headers: dict[str, str]) -> None:
        """The client's headers for what follows (the GET stream's included) until a message
        brings others."""
        self._caller_headers = caller_headers

    def feed(self, message: Any, caller_headers: dict[str, str] | None = None) -> None:
        """One parsed message of the client (parse_message), with the client's headers to pass on."""
        if caller_headers is not None:
            self._caller_headers = caller_headers
        if self.era is None:
            self.era = choose_era(message[0] if isinstance(message, list) and message else message)
            if self.era is None:
                request_id = id_or_none(message)
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
        if self._refused(message):
            return
        if self.era == MODERN:
            self._modern(message)
        else:
            self._legacy(message)

    def _refused(self, message: Any) -> bool:
        """What the HTTP edge refuses (client_checks.message_problem), refused here with the same
        code before any request is built from it (a control character in a method would not even
        make a header). A request gets the error under its id; a batch one error, as over HTTP; a
        notification nothing (it gets no reply), only the log."""
        items = message if isinstance(message, list) else [message]
        for item in items:
            problem = client_checks.message_problem(item) if isinstance(item, dict) else None
            if problem is None:
                continue
            refused = item if not isinstance(message, list) else None
            request_id = id_or_none(refused) if refused is not None and jsonrpc.kind(refused) == "request" else None
            log.info("stdio_message_refused", status=problem.status, code=problem.code, method=logged_method(item))
            if refused is None or request_id is not None:
                self._writer.write(jsonrpc.error_response(request_id, problem.code, problem.message, problem.data))
            return True
        return False

    def _spawn(self, coro: Any, request_id: Any = None) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda done: self._observe(done, request_id))
        if request_id is not None:
            self._in_flight[request_id] = task
            task.add_done_callback(
                lambda _t: self._in_flight.pop(request_id, None) if self._in_flight.get(request_id) is _t else None
            )
        return task

    def _observe(self, task: asyncio.Task[None], request_id: Any) -> None:
        """No task of the bridge ends unobserved: a failure nothing caught is logged, and the
        request it served (if any) gets an error instead of no reply."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        log.error("stdio_task_failed", error=f"{type(exc).__name__}: {exc}", id=request_id)
        if request_id is not None:
            self._writer.write(
                jsonrpc.error_response(request_id, jsonrpc.INTERNAL_ERROR, "the proxy could not serve the request")
            )

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
            headers = self._with_caller(modern_headers(message, self._modern_version))
            method = message.get("method")
            if method == "tools/call":
                self._spawn(self._call_tool(message, headers), message["id"])
            elif method == "tools/list":
                self._spawn(self._post(message, headers, on_message=self._tools.listed(message["id"])), message["id"])
            else:
                self._spawn(self._post(message, headers), message["id"])
        elif kind == "notification":
            if message.get("method") == "notifications/cancelled":
                self._cancel(message)
            # Over HTTP a modern notification has nothing to act on at the endpoint; sent anyway.
            self._spawn(self._post(message, self._with_caller(modern_headers(message, self._modern_version))))
        else:
            log.info("stdio_unexpected_response", id=message.get("id"))

    # ------------------------------------------------------------ modern tool headers

    async def _call_tool(self, message: dict[str, Any], headers: dict[str, str]) -> None:
        params = message.get("params")
        if isinstance(params, dict):
            headers = {**headers, **await self._tools.call_headers(params, self._ask_modern)}
        await self._post(message, headers)

    async def _ask_modern(self, request: dict[str, Any]) -> Any:
        return await self._ask(request, self._with_caller(modern_headers(request, self._modern_version)))

    async def _ask(self, request: dict[str, Any], headers: dict[str, str]) -> Any:
        """The endpoint's answer to a request of the bridge's own (None if there is none)."""
        try:
            async with self._http.post(
                self._url, data=jsonrpc.encode(request), headers=headers, timeout=_OWN_REQUEST_TIMEOUT
            ) as response:
                if response.headers.get("Content-Type", "").startswith("text/event-stream"):
                    async for data in sse_events(response.content):
                        message = jsonrpc.decode(data)
                        if isinstance(message, dict) and message.get("id") == request["id"] and "method" not in message:
                            return message
                    return None
                return jsonrpc.decode(await response.read())
        except (TimeoutError, aiohttp.ClientError, OSError, jsonrpc.DecodeError) as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}

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
            self._spawn(self._initialize(message, dict(self._caller_headers)), message["id"])
            return
        request_id = message.get("id") if isinstance(message, dict) and jsonrpc.kind(message) == "request" else None
        if isinstance(message, dict) and message.get("method") == "notifications/initialized":
            self._stream_ready = asyncio.Event()  # before anything that follows is spawned
        if isinstance(message, dict) and message.get("method") == "notifications/cancelled":
            params = message.get("params")
            cancelled = params.get("requestId") if isinstance(params, dict) else None
            if jsonrpc.is_request_id(cancelled) and cancelled in self._in_flight:
                self._cancelled[cancelled] = None
                while len(self._cancelled) > _CANCELLED_KEPT:
                    self._cancelled.popitem(last=False)
        self._spawn(self._legacy_post(message, dict(self._caller_headers)), request_id)

    def _with_caller(self, headers: dict[str, str]) -> dict[str, str]:
        return {**self._caller_headers, **headers}

    def _legacy_headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": ACCEPT}
        if self._session_id is not None:
            headers[SESSION_HEADER] = self._session_id
        if self._legacy_version is not None:
            headers[PROTOCOL_VERSION_HEADER] = self._legacy_version
        return headers

    async def _initialize(self, message: dict[str, Any], caller: dict[str, str]) -> None:
        try:

            async def seen(response: aiohttp.ClientResponse) -> None:
                session_id = response.headers.get(SESSION_HEADER)
                if session_id:
                    self._session_id = session_id

            def on_message(reply: Any) -> Any:
                if isinstance(reply, dict) and reply.get("id") == message["id"]:
                    result = reply.get("result")
                    version = result.get("protocolVersion") if isinstance(result, dict) else None
                    if isinstance(version, str):
                        self._legacy_version = version
                return reply

            headers = {**caller, "Content-Type": "application/json", "Accept": ACCEPT}
            await self._post(message, headers, seen, on_message)
        finally:
            self._initialized.set()

    async def _legacy_post(self, message: Any, caller: dict[str, str]) -> None:
        await self._initialized.wait()
        initialized = isinstance(message, dict) and message.get("method") == "notifications/initialized"
        ready = self._stream_ready
        if not initialized and ready is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ready.wait(), _STREAM_READY_S)
        await self._post(message, {**caller, **self._legacy_headers()})
        if initialized:
            if self._session_id is not None and self._stream is None:
                self._stream = asyncio.create_task(self._listen(), name="get-stream")
            elif ready is not None:
                ready.set()  # no stream to wait for

    async def _listen(self) -> None:
        """The session's GET stream: server requests and notifications, reopened if it ends."""
        delay = 0.1
        while True:
            try:
                headers = {**self._caller_headers, **self._legacy_headers(), "Accept": "text/event-stream"}
                async with self._http.get(self._url, headers=headers, timeout=_NO_TIMEOUT) as response:
                    if self._stream_ready is not None:
                        self._stream_ready.set()  # answered, or refused: the host waits no more
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
                if self._stream_ready is not None:
                    self._stream_ready.set()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    # ------------------------------------------------------------ one POST

    async def _post(
        self,
        message: Any,
        headers: dict[str, str],
        on_response: Callable[[aiohttp.ClientResponse], Any] | None = None,
        on_message: Callable[[Any], Any] | None = None,
    ) -> None:
        """POST one message; every JSON-RPC message of the reply (JSON or SSE) goes to stdout."""
        request_id = id_or_none(message) if isinstance(message, dict) and "method" in message else None
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
                        log.info("stdio_message_refused", status=response.status, method=logged_method(message))
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

    def _emit(self, data: bytes, on_message: Callable[[Any], Any] | None) -> None:
        try:
            message = jsonrpc.decode(data)
        except jsonrpc.DecodeError:
            log.warning("stdio_unreadable_reply", size=len(data))
            return
        if on_message is not None:
            message = on_message(message)  # what it returns is what the client gets
        if isinstance(message, list) and not message:
            return
        if isinstance(message, dict) and "method" not in message and self._cancelled:
            request_id = message.get("id")
            if jsonrpc.is_request_id(request_id) and request_id in self._cancelled:
                del self._cancelled[request_id]
                log.info("stdio_cancelled_reply_dropped", id=request_id)
                return
        self._writer.write(message)


_NO_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_read=None)
_STREAM_READY_S = 5.0  # how long the host's messages after `initialized` wait for the GET stream
_OWN_REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=30.0)
_CANCELLED_KEPT = 1024  # cancelled request ids remembered at most (the oldest go first)

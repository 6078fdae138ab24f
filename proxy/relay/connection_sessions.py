"""Legacy clients of a legacy stdio or HTTP+SSE server: the backend of the legacy session host in
which each client session is a connection of its own, a server process (stdio) or an SSE
connection (HTTP+SSE, which has the process interface: upstream/sse.py).

The proxy serves the Streamable HTTP side of the session (its id, the GET stream, DELETE) and
relays the messages one by one, unchanged: the server process speaks the client's own revision.
What the server sends outside a reply goes on the one request open, else on the GET stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import structlog

from .. import tracing
from ..config import Settings
from ..errors import ProxyError
from ..protocol import jsonrpc
from ..protocol.versions import LEGACY_VERSIONS
from ..state.sessions import LegacySession
from ..upstream.errors import UpstreamError, UpstreamUnavailable
from ..upstream.stdio import (
    ProbeHandover,
    Route,
    StdioChannel,
    StdioProcess,
    span_transport,
    use_credentials,
    with_headers,
)
from .channel import ReplyChannel
from .detect import Handshakes
from .failures import UpstreamFailures
from .legacy_sessions import Opened
from .runtime import SessionRuntime

JSONDict = dict[str, Any]
log = structlog.get_logger(__name__)


class Process:
    """The backend's live part of one session: its server process and the requests open on it."""

    def __init__(self, make_channel: Callable[[Process], StdioChannel]) -> None:
        # the client's requests open on the process, by id, with their reply channel
        self.routes: dict[Any, tuple[Route, ReplyChannel | None]] = {}
        self.runtime: SessionRuntime[Process] | None = None
        self.lost: Callable[[str], None] = lambda reason: None
        self.channel = make_channel(self)


Runtime = SessionRuntime[Process]


class ProcessBackend:
    durable = False  # a session is its process: it cannot outlive it, nor move

    def __init__(
        self,
        settings: Settings,
        make_process: Callable[..., StdioProcess],
        name: str,
        failures: UpstreamFailures,
        handover: ProbeHandover | None = None,
        handshakes: Handshakes | None = None,
    ) -> None:
        """`handover`: where the era probe's process waits (one initialized with a client's own
        `initialize` is that client's); `handshakes`: told how each session's `initialize` went."""
        self._settings = settings
        self._make_process = make_process
        self._name = name
        self._failures = failures
        self._handover = handover
        self._handshakes = handshakes if handshakes is not None else Handshakes(name)

    async def open(self, message: JSONDict, principal: str, auth_headers: dict[str, str]) -> Opened[Process]:
        """Start the session's process and relay the client's `initialize` to it (or take the era
        probe's process, which that very `initialize` went to, with its answer)."""
        probed = self._handover.take_legacy(message) if self._handover is not None else None

        def channel_of(owner: Process) -> StdioChannel:
            unsolicited, exited = (lambda m: self._unsolicited(owner, m)), (lambda code: owner.lost("exited"))
            if probed is not None:
                return probed[0].rebind(unsolicited, exited)
            # HTTP+SSE: the caller's credentials on the GET and the POSTs
            return StdioChannel(with_headers(self._make_process, auth_headers), self._name, unsolicited, exited)

        process = Process(channel_of)
        channel = process.channel
        if probed is not None and probed[1] is not None:  # the probe wrote this initialize: answered
            reply = probed[1]
        else:
            reply = await self._initialize(process, message, started=probed is not None)
        result = reply.get("result")
        if not isinstance(result, dict) or result.get("protocolVersion") not in LEGACY_VERSIONS:
            await channel.stop(self._settings.upstream.shutdown_grace_s)
            error = jsonrpc.obj(reply.get("error"))
            code = error.get("code")
            refused = ProxyError(
                code if isinstance(code, int) else jsonrpc.INTERNAL_ERROR,
                str(error.get("message", "the upstream refused initialize")),
                data=error.get("data"),
            )
            self._handshakes.failed(refused)
            raise refused
        self._handshakes.worked()
        return Opened(
            result,
            result["protocolVersion"],
            process,
            server_capabilities=jsonrpc.obj(result.get("capabilities")),
            log_fields={"upstream_process": channel.process.pid},
        )

    async def _initialize(self, process: Process, message: JSONDict, *, started: bool) -> JSONDict:
        """Start the process (unless `started`: the era probe's) and relay `initialize`: the
        server's answer."""
        channel = process.channel
        try:
            if not started:
                await channel.start()
        except UpstreamError as exc:
            self._handshakes.failed(exc)
            raise self._failures.client_error(exc) from None
        try:
            async with asyncio.timeout(self._settings.upstream.initialize_timeout_s):
                return await self._exchange(process, message, None)
        except UpstreamError as exc:
            await channel.stop(self._settings.upstream.shutdown_grace_s)
            self._handshakes.failed(exc)
            raise self._failures.client_error(exc) from None
        except TimeoutError:
            await channel.stop(self._settings.upstream.shutdown_grace_s)
            failure = self._failures.timeout(self._name)
            self._handshakes.failed(failure)
            raise failure from None

    def started(self, runtime: Runtime, lost: Callable[[str], None]) -> None:
        runtime.live.runtime = runtime
        runtime.live.lost = lost

    def revive(self, session: LegacySession) -> Process | None:
        return None  # its process is gone with the runtime

    async def close(self, runtime: Runtime) -> None:
        await runtime.live.channel.stop(self._settings.upstream.shutdown_grace_s)

    # ------------------------------------------------------------ messages

    async def request(
        self,
        session: LegacySession,
        runtime: Runtime,
        message: JSONDict,
        channel: ReplyChannel,
        auth_headers: dict[str, str],
    ) -> JSONDict:
        use_credentials(runtime.live.channel, auth_headers)  # HTTP+SSE: a refreshed token goes on
        try:
            async with asyncio.timeout(self._settings.upstream.request_timeout_s):
                return await self._exchange(runtime.live, message, channel)
        except UpstreamError as exc:
            raise self._failures.client_error(exc) from None
        except TimeoutError:
            raise self._failures.timeout(self._name) from None

    async def _exchange(self, process: Process, message: JSONDict, channel: ReplyChannel | None) -> JSONDict:
        span = tracing.upstream(message, span_transport(self._make_process))
        if span is not tracing.NULL_UPSTREAM:  # stdio has no headers: the trace context goes in `_meta`
            message = span.message(message) or message
        route = process.channel.open_route(message)
        process.routes[message["id"]] = (route, channel)
        try:
            await process.channel.send(message)
            async for incoming in route.messages():
                if "method" not in incoming:
                    span.end()
                    return incoming
                if channel is not None and channel.can_stream:
                    await channel.send(incoming)  # progress, or what the server sends meanwhile
        except BaseException as exc:
            span.end(exc)
            raise
        finally:
            process.channel.close_route(route)
            process.routes.pop(message["id"], None)
        ended = UpstreamUnavailable(self._name, "ended the request without a reply")
        span.end(ended)
        raise ended

    async def notify(self, session: LegacySession, runtime: Runtime, message: JSONDict) -> None:
        with contextlib.suppress(ConnectionError):
            await runtime.live.channel.write(message)

    async def respond(self, session: LegacySession, runtime: Runtime, message: JSONDict) -> bool:
        try:
            await runtime.live.channel.write(message)
        except ConnectionError:
            return False
        return True

    async def resume(
        self,
        session: LegacySession,
        runtime: Runtime,
        request_id: Any,
        seen_seq: int,
        channel: ReplyChannel,
        auth_headers: dict[str, str],
    ) -> JSONDict | None:
        return None  # a session that is a process lives on one replica only

    def get_stream_opened(
        self, session: LegacySession, runtime: Runtime, moved: bool, auth_headers: dict[str, str] | None
    ) -> None:
        return None  # the process says what it says; the GET stream carries what no request can

    def _unsolicited(self, process: Process, message: JSONDict) -> None:
        """What the server sends outside a reply: on the one request open, else the GET stream."""
        if len(process.routes) == 1:
            route, channel = next(iter(process.routes.values()))
            if channel is not None and channel.can_stream:
                route.queue.put_nowait(message)  # relayed in order with the request's own messages
                return
        if process.runtime is not None:
            process.runtime.deliver(message)

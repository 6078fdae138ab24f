"""A supervised child process speaking MCP as newline-delimited JSON-RPC on stdin/stdout.

Spec: 2026-07-28/basic/transports/stdio.mdx. One message per line in both directions; stderr is
free-form and goes to the structured logs. Shutdown closes stdin first, then escalates to
SIGTERM and SIGKILL; the process runs in its own process group so its children go with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

import structlog

from .. import tracing
from ..protocol import jsonrpc, meta
from .errors import UpstreamUnavailable

JSONDict = dict[str, Any]
log = structlog.get_logger(__name__)

_LINE_LIMIT = 64 * 1024 * 1024  # one JSON-RPC message per line; results can be large
_STDERR_LINE_LIMIT = 4096


class Tally(Protocol):
    """What counts the processes running (a gauge)."""

    def inc(self) -> None: ...
    def dec(self) -> None: ...


def span_transport(make_process: object) -> str:
    """How an exchange over the channels `make_process` makes is told in traces: an HTTP+SSE
    connection's messages are HTTP POSTs (upstream/sse.py SseConnector), a process's a pipe."""
    return "http" if getattr(make_process, "span_transport", "stdio") == "http" else "stdio"


class StdioProcess:
    def __init__(
        self,
        argv: Sequence[str],
        *,
        name: str,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        on_message: Callable[[JSONDict], None],
        on_exit: Callable[[int | None], None] = lambda code: None,
        tally: Tally | None = None,
    ) -> None:
        self.argv = list(argv)
        self.name = name
        self._tally = tally  # of the processes running
        self._env = {**os.environ, **(env or {})}
        self._cwd = cwd
        self._on_message = on_message
        self._on_exit = on_exit
        self._process: asyncio.subprocess.Process | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._write_lock = asyncio.Lock()
        self.exited = asyncio.Event()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None and not self.exited.is_set()

    async def start(self) -> None:
        """Start the process; UpstreamUnavailable naming the program and the OS's reason if it cannot be."""
        try:
            self._process = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env,
                cwd=self._cwd,
                limit=_LINE_LIMIT,
                start_new_session=True,  # its own process group: stop() reaches its children too
            )
        except (OSError, ValueError) as exc:  # ValueError: a NUL byte in an argument
            # The name is said here: uvloop's OSError carries no file name.
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise UpstreamUnavailable(self.name, f"could not start {self.argv[0]!r}: {reason}") from None
        if self._tally is not None:
            self._tally.inc()  # down again once it is reaped (_read_stdout)
        self._tasks = [
            asyncio.create_task(self._read_stdout(), name=f"stdio-out-{self.pid}"),
            asyncio.create_task(self._read_stderr(), name=f"stdio-err-{self.pid}"),
        ]
        log.info("upstream_process_started", upstream=self.name, pid=self.pid)

    async def write(self, message: JSONDict) -> None:
        process = self._process
        if process is None or process.stdin is None or not self.running:
            raise ConnectionError(f"upstream process {self.name!r} is not running")
        async with self._write_lock:
            process.stdin.write(jsonrpc.encode(message) + b"\n")
            await process.stdin.drain()

    async def _read_stdout(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        stdout = self._process.stdout
        try:
            while True:
                try:
                    line = await stdout.readline()
                except ValueError:  # a line over the limit: skip the rest of it
                    log.warning("upstream_line_too_long", upstream=self.name, limit=_LINE_LIMIT)
                    await stdout.readuntil(b"\n")
                    continue
                if not line:
                    break
                if not line.strip():
                    continue
                try:
                    message = jsonrpc.decode(line)
                except jsonrpc.DecodeError:
                    log.warning("upstream_invalid_line", upstream=self.name, line=line[:200].decode("utf-8", "replace"))
                    continue
                if jsonrpc.kind(message) == "invalid":
                    log.warning("upstream_invalid_message", upstream=self.name, message=str(message)[:200])
                    continue
                self._on_message(message)
        finally:
            code = await self._process.wait()
            if self._tally is not None:
                self._tally.dec()
            self.exited.set()
            log.info("upstream_process_exited", upstream=self.name, pid=self.pid, code=code)
            self._on_exit(code)

    async def _read_stderr(self) -> None:
        assert self._process is not None and self._process.stderr is not None
        stderr = self._process.stderr
        while True:
            try:
                line = await stderr.readline()
            except ValueError:
                await stderr.readuntil(b"\n")
                continue
            if not line:
                return
            text = line.decode("utf-8", "replace").rstrip()
            if text:
                log.info("upstream_stderr", upstream=self.name, pid=self.pid, line=text[:_STDERR_LINE_LIMIT])

    async def stop(self, grace_s: float = 5.0) -> int | None:
        """Close stdin, then SIGTERM, then SIGKILL (each after `grace_s`); reap; close pipes."""
        process = self._process
        if process is None:
            return None
        if process.stdin is not None and not process.stdin.is_closing():
            process.stdin.close()
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            # Until stdout closes, something in the group (the child or one of its own) lives.
            if sig is not None and not self.exited.is_set():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, sig)
            try:
                async with asyncio.timeout(grace_s):
                    await self.exited.wait()
                break
            except TimeoutError:
                continue
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await asyncio.gather(*self._tasks, return_exceptions=True)
        for task in self._tasks:
            task.cancel()
        if process.stdin is not None:
            with contextlib.suppress(ConnectionError, BrokenPipeError):
                await process.stdin.wait_closed()
        return process.returncode


class Route:
    """The messages of one request, multiplexed out of the shared stdout."""

    __slots__ = ("done", "id", "queue", "token", "wants_logs")

    def __init__(self, request_id: Any, token: Any, wants_logs: bool) -> None:
        self.id = request_id
        self.token = token
        self.wants_logs = wants_logs
        self.queue: asyncio.Queue[JSONDict | BaseException] = asyncio.Queue()
        self.done = False

    async def messages(self) -> AsyncIterator[JSONDict]:
        while True:
            item = await self.queue.get()
            if isinstance(item, BaseException):
                raise item
            if "method" not in item:
                self.done = True  # answered: leaving now must not cancel it
                yield item
                return
            yield item


class StdioReply:
    """What `exchange` yields for stdio: the same shape as the HTTP Reply (no headers)."""

    status = 200
    headers: Mapping[str, str] = {}

    def __init__(self, route: Route, on_message: Callable[[], None] = lambda: None) -> None:
        self._route = route
        self._on_message = on_message

    async def _messages(self) -> Any:
        async for message in self._route.messages():
            self._on_message()
            yield message

    def __aiter__(self) -> Any:
        return self._messages()


class StdioChannel:
    """Requests and their replies over one stdio process, multiplexed by request id.

    Replies are routed by id; progress by token; listen notifications by subscription id; logs
    to the one in-flight request that asked for them (stdio has no per-request stream, so with
    several such requests at once a log message cannot be attributed). Anything else, including
    such logs, goes to `on_unsolicited`.

    `modern`: the server speaks 2026-07-28, which has no server requests, so its
    `notifications/cancelled` ends one of ours (a listen, when it shuts down). A legacy server's
    names one of its own requests (2025-11-25 basic/utilities/cancellation.mdx: a side cancels
    only what it sent), numbered apart from ours, and goes to `on_unsolicited` like the rest.
    """

    def __init__(
        self,
        process_factory: Callable[..., StdioProcess],
        name: str,
        on_unsolicited: Callable[[JSONDict], None] = lambda message: None,
        on_exit: Callable[[int | None], None] = lambda code: None,
        *,
        modern: bool = False,
    ) -> None:
        self.name = name
        self._modern = modern
        self._routes: dict[Any, Route] = {}
        self._tokens: dict[Any, Route] = {}
        self._on_unsolicited = on_unsolicited
        self._on_exit_callback = on_exit
        self.process = process_factory(on_message=self._on_message, on_exit=self._on_exit)

    @property
    def running(self) -> bool:
        return self.process.running

    async def start(self) -> None:
        await self.process.start()

    async def stop(self, grace_s: float) -> int | None:
        return await self.process.stop(grace_s)

    def open_route(self, message: JSONDict) -> Route:
        request_meta = meta.meta_of(message.get("params")) or {}
        # A listen carries the log level too, but logs belong to requests, not to listen streams:
        # counting it would leave a call's logs unattributed whenever the session also listens.
        wants_logs = meta.LOG_LEVEL in request_meta and message.get("method") != "subscriptions/listen"
        route = Route(message["id"], request_meta.get("progressToken"), wants_logs)
        if route.id in self._routes:
            raise ValueError(f"request id {route.id!r} is already in flight on {self.name!r}")
        self._routes[route.id] = route
        if route.token is not None:
            self._tokens[route.token] = route
        return route

    def close_route(self, route: Route) -> None:
        if self._routes.get(route.id) is route:
            del self._routes[route.id]
        if route.token is not None and self._tokens.get(route.token) is route:
            del self._tokens[route.token]

    async def write(self, message: JSONDict) -> None:
        await self.process.write(message)

    async def send(self, message: JSONDict) -> None:
        """`write`, failing as the UpstreamUnavailable a caller relays (`write` raises ConnectionError)."""
        try:
            await self.process.write(message)
        except ConnectionError as exc:
            raise UpstreamUnavailable(self.name, f"cannot be written to ({exc})") from None

    def _on_message(self, message: JSONDict) -> None:
        if "method" not in message:
            route = self._routes.get(message.get("id"))
            if route is not None:
                route.queue.put_nowait(message)
            else:
                log.debug("upstream_reply_dropped", upstream=self.name, id=message.get("id"))
            return
        params = jsonrpc.params_of(message)
        route = None
        if "id" not in message:
            method = message["method"]
            note_meta = meta.meta_of(params) or {}
            if meta.SUBSCRIPTION_ID in note_meta:
                route = self._routes.get(note_meta[meta.SUBSCRIPTION_ID])
            elif method == "notifications/progress":
                route = self._tokens.get(params.get("progressToken"))
            elif method == "notifications/message":
                asking = [r for r in self._routes.values() if r.wants_logs]
                route = asking[0] if len(asking) == 1 else None
            elif method == "notifications/cancelled" and self._modern and params.get("requestId") in self._routes:
                # The server ended one of our requests (a listen at its shutdown): read it as the end.
                ended = self._routes[params["requestId"]]
                ended.queue.put_nowait(jsonrpc.result_response(ended.id, {"resultType": "complete"}))
                return
        if route is not None:
            route.queue.put_nowait(message)
        else:
            self._on_unsolicited(message)

    def rebind(
        self,
        on_unsolicited: Callable[[JSONDict], None],
        on_exit: Callable[[int | None], None],
        *,
        modern: bool = False,
    ) -> StdioChannel:
        """The channel of a process started for another owner (the era probe's), given to a new
        one: what it sends unasked, and its exit, go to the new owner from now on."""
        self._on_unsolicited = on_unsolicited
        self._on_exit_callback = on_exit
        self._modern = modern
        return self

    def _on_exit(self, code: int | None) -> None:
        # A process exits with a code; an HTTP+SSE connection (upstream/sse.py) says how it ended.
        ended = getattr(self.process, "ended", None) or f"exited (code {code})"
        for route in list(self._routes.values()):
            route.queue.put_nowait(UpstreamUnavailable(self.name, f"{ended} during the request"))
        self._routes.clear()
        self._tokens.clear()
        self._on_exit_callback(code)


class ProbeHandover:
    """The era probe's server process, kept for the first user it fits instead of being stopped:
    a server started once where it would be started twice (a cold `npx` install paid once).

    A 2026-07-28 server's goes to the one shared process (StdioModernUpstream). A legacy server's
    goes to the first legacy session (a legacy client's own, or a pooled one) that it fits: any,
    when the probe wrote no `initialize` (the server answered `server/discover` first); else only
    the one whose `initialize` is the very one the probe wrote (a legacy client's own, when it came
    during the probe; else a pooled session's of no capabilities, readiness's), with the answer to
    it: a legacy server's session is what its `initialize` made it. Unclaimed after `keep_s`, or at
    shutdown, it is stopped (docs/translation.md §1.4)."""

    # The user it fits comes at once: the request that needed the era goes on as soon as it is
    # known (a legacy client's session, readiness's pooled one, the shared 2026-07-28 process).
    def __init__(self, name: str, grace_s: float, keep_s: float = 5.0) -> None:
        self._name = name
        self._grace_s = grace_s
        self._keep_s = keep_s
        self._held: tuple[StdioChannel, bool, JSONDict | None, JSONDict | None] | None = None
        self._expiry: asyncio.TimerHandle | None = None
        self._stopping: set[asyncio.Task[Any]] = set()

    def hold(self, channel: StdioChannel, *, modern: bool, hello: JSONDict | None, answer: JSONDict | None) -> bool:
        """Keep `channel`: its server `modern`, or legacy, and then either not initialized (`hello`
        None) or initialized with `hello` and answered `answer`. False: not kept (the caller stops it)."""
        if not channel.running or (not modern and hello is not None and answer is None):
            return False
        self._release()
        self._held = (channel, modern, hello, answer)
        channel.rebind(lambda message: None, lambda code: self._exited(channel))
        self._expiry = asyncio.get_running_loop().call_later(self._keep_s, self._release)
        return True

    def _exited(self, channel: StdioChannel) -> None:
        """A held process exited: forgotten. One held before, replaced and stopping, is not."""
        if self._held is not None and self._held[0] is channel:
            self._forget()

    def take_modern(self) -> StdioChannel | None:
        held = self._held
        if held is None or not held[1] or not held[0].running:
            return None
        self._forget()
        return held[0]

    def take_legacy(self, initialize: JSONDict) -> tuple[StdioChannel, JSONDict | None] | None:
        """The held legacy server's channel for a session that opens with `initialize`, with the
        server's answer to it (under `initialize`'s id) when the probe wrote it already (None: send
        it)."""
        held = self._held
        if held is None or held[1] or not held[0].running:
            return None
        channel, _, hello, answer = held
        if hello is not None and hello.get("params") != initialize.get("params"):
            return None
        self._forget()
        return channel, None if answer is None else {**answer, "id": initialize.get("id")}

    def _forget(self) -> None:
        self._held = None
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    def _release(self) -> None:
        """Nobody took the process held, if any: stopped."""
        held = self._held
        self._forget()
        if held is not None:
            log.info("upstream_probe_process_unclaimed", upstream=self._name)
            task = asyncio.get_running_loop().create_task(held[0].stop(self._grace_s))
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    async def close(self) -> None:
        """Shutdown: a process still held is stopped."""
        self._release()
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)


def process_factory(
    argv: Sequence[str], name: str, env: Mapping[str, str] | None, cwd: str | None, tally: Tally | None = None
) -> Callable[..., StdioProcess]:
    def make(*, on_message: Callable[[JSONDict], None], on_exit: Callable[[int | None], None]) -> StdioProcess:
        return StdioProcess(argv, name=name, env=env, cwd=cwd, on_message=on_message, on_exit=on_exit, tally=tally)

    return make


def use_credentials(channel: StdioChannel, headers: Mapping[str, str]) -> None:
    """The caller's latest credentials on what the channel sends from now on, when it carries
    headers (an HTTP+SSE connection); nothing for a process."""
    refresh = getattr(channel.process, "use_credentials", None)
    if refresh is not None:
        refresh(dict(headers))


def with_headers(make: Callable[..., Any], headers: Mapping[str, str]) -> Callable[..., Any]:
    """`make` bound to one caller's credentials when its channels carry headers (an HTTP+SSE
    server's connections, upstream/sse.py); a process factory as it is (stdio has no headers)."""
    if getattr(make, "accepts_headers", False):
        return functools.partial(make, headers=dict(headers))
    return make


class StdioModernUpstream:
    """A modern (2026-07-28) stdio server: one process shared by every caller, supervised.

    `exchange()` has the shape of HttpUpstream.exchange: the relays do not care which it is.
    A crashed process fails its in-flight requests at once and is restarted with backoff.
    """

    transport = "stdio"

    def __init__(
        self,
        name: str,
        make_process: Callable[..., StdioProcess],
        *,
        grace_s: float,
        backoff_max_s: float,
        clock: Callable[[], float] = time.monotonic,
        handover: ProbeHandover | None = None,
    ) -> None:
        """`handover`: where the era probe's process waits to be taken (the first start takes it)."""
        self.name = name
        self._make_process = make_process
        self._handover = handover
        self._grace_s = grace_s
        self._backoff_max_s = backoff_max_s
        self._clock = clock
        self._channel: StdioChannel | None = None
        self._lock = asyncio.Lock()
        self._failures = 0
        self._next_start = 0.0
        self._cannot_start: str | None = None  # why the last start failed, until one succeeds
        self._closed = False
        self.restarts = 0

    @property
    def healthy(self) -> bool:
        return self._channel is not None and self._channel.running

    async def _running_channel(self) -> StdioChannel:
        channel = self._channel
        if channel is not None and channel.running:
            return channel
        async with self._lock:
            if self._channel is not None and self._channel.running:
                return self._channel
            if self._closed:
                raise UpstreamUnavailable(self.name, "is shut down")
            wait = self._next_start - self._clock()
            if wait > 0 and self._cannot_start is not None:
                # It could not even be started (not installed?): waiting here would only hold the
                # request (and those queued behind it) for the same answer. Tried again after the wait.
                raise UpstreamUnavailable(self.name, self._cannot_start)
            if wait > 0:  # crash loop: back off before starting it again
                await asyncio.sleep(wait)
            if self._channel is not None:
                self.restarts += 1
                await self._channel.stop(self._grace_s)
            probed = self._handover.take_modern() if self._handover is not None else None
            if probed is not None:  # the era probe's process, already up: not started twice
                channel = probed.rebind(self._unsolicited, self._exited, modern=True)
            else:
                channel = StdioChannel(self._make_process, self.name, self._unsolicited, self._exited, modern=True)
                try:
                    await channel.start()
                except UpstreamUnavailable as exc:
                    self._exited(None)  # a failed start backs off like a crash
                    self._cannot_start = str(exc)
                    raise
            self._cannot_start = None
            self._channel = channel
            return channel

    def _exited(self, code: int | None) -> None:
        self._failures += 1
        delay = min(0.25 * 2 ** (self._failures - 1), self._backoff_max_s)
        self._next_start = self._clock() + delay

    def _unsolicited(self, message: JSONDict) -> None:
        log.debug("upstream_message_unattributed", upstream=self.name, method=message.get("method"))

    @asynccontextmanager
    async def exchange(self, message: JSONDict, headers: Mapping[str, str] | None = None) -> AsyncIterator[StdioReply]:
        span = tracing.upstream(message, "stdio")
        try:
            if span is not tracing.NULL_UPSTREAM:  # the trace context the server reads is this span's
                message = span.message(message) or message
            channel = await self._running_channel()
            route = channel.open_route(message)
            try:
                await channel.send(message)
                yield StdioReply(route, on_message=self.answered)
            finally:
                channel.close_route(route)
                if not route.done and channel.running:
                    # No per-request stream to close on stdio: cancellation is a notification.
                    with contextlib.suppress(ConnectionError):
                        await channel.write(jsonrpc.notification("notifications/cancelled", {"requestId": route.id}))
        except BaseException as exc:
            span.end(exc)
            raise
        span.end()

    async def send(self, message: JSONDict, headers: Mapping[str, str] | None = None) -> None:
        """Write a notification to the server process (started if need be); nothing answers it."""
        channel = await self._running_channel()
        await channel.send(message)

    def answered(self) -> None:
        self._failures = 0  # it works: the next restart after a crash is not delayed

    async def close(self) -> None:
        self._closed = True
        if self._channel is not None:
            await self._channel.stop(self._grace_s)

"""One call of a modern client on a pooled legacy upstream session: the executor of a ParkedCall.

The relay (relay/modern_to_legacy.py) opens the call and serves its attached requests; the call
runs what happens upstream: the reader of its stream, its answers to the server, its abandon, and
the freeing of its session once it is over.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import structlog

from ..errors import ProxyError
from ..protocol import jsonrpc, meta
from ..protocol import modern_to_legacy as m2l
from ..protocol.outcome import UpstreamFailure
from ..protocol.parked_call import (
    Abandon,
    Action,
    AnswerServer,
    Detach,
    Fail,
    Park,
    ParkedCall,
    RelayToClient,
    Release,
    ReplyClient,
    StartCollecting,
)
from ..upstream.base import Reply
from ..upstream.errors import UpstreamError, UpstreamSessionGone
from ..upstream.legacy_session import CallSink, LegacyUpstreamSession, unsendable
from .scopes import TaskScope
from .tasks.modern_clients import TaskCall

JSONDict = dict[str, Any]
log = structlog.get_logger(__name__)

_ABANDON_TIMEOUT_S = 5.0  # for telling the upstream that a call is given up
_DOWNSTREAM = (RelayToClient, ReplyClient, Park, Fail)  # actions only the attached handler executes
Exchange = AbstractAsyncContextManager[Reply]  # a call's upstream exchange, entered by hand (open)


class CallSessions(Protocol):
    """The pool a call's session comes from."""

    async def replace(self, session: LegacyUpstreamSession) -> LegacyUpstreamSession: ...

    def release(self, session: LegacyUpstreamSession) -> None: ...


class CallOwner(Protocol):
    """What a LegacyCall needs of the relay that runs it."""

    @property
    def name(self) -> str: ...  # the upstream's

    @property
    def request_timeout_s(self) -> float: ...

    @property
    def pool(self) -> CallSessions: ...

    def count_reinitialized(self) -> None: ...

    def unpark(self, call: LegacyCall) -> None: ...

    def forget(self, call: LegacyCall) -> None: ...


class LegacyCall:
    """Executes one ParkedCall on its upstream session.

    Downstream actions wait in `outbox` for the handler of the attached request, which is the only
    writer of that request's reply. Upstream actions run at once, in tasks the call owns.
    """

    # Defaults an instance overrides when it needs to: set in __init__, they would cost every call.
    as_task = False  # a tool the server runs only as a task: made as one (TaskCall)
    hosted_task: str | None = None  # the id of the task the proxy hosts it in, if one
    upstream_task_id: str | None = None  # that task, once the server created it
    finished = False
    _timer: asyncio.TimerHandle | None = None
    _reader: asyncio.Task[None] | None = None
    # Made when first needed: a plain call answered in its handler waits for no wakeup, knows of no
    # task and starts no task of its own.
    _wakeup: asyncio.Event | None = None
    _task_known: asyncio.Event | None = None
    _tasks: TaskScope | None = None

    def __init__(
        self,
        relay: CallOwner,
        session: LegacyUpstreamSession,
        machine: ParkedCall,
        *,
        interactive: bool,
        upstream_token: str | None,
        trace: dict[str, str],
    ) -> None:
        self.relay = relay
        self.session = session
        self.machine = machine
        self.interactive = interactive
        self.upstream_token = upstream_token
        self.trace = trace  # this request's trace context (not the session's)
        self.outbox: deque[Action] = deque()
        # How long the client waits for a round of it: a request's bound, or a hosted task's retention.
        self.timeout_s = relay.request_timeout_s

    @property
    def wakeup(self) -> asyncio.Event:
        """Set when a downstream action waits in `outbox`. A handler drains the outbox before it
        waits, so an Event made at its first wait has missed nothing."""
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
        return self._wakeup

    @property
    def task_known(self) -> asyncio.Event:
        """Set once the server's answer to the task-augmented call was read (or could not be)."""
        if self._task_known is None:
            self._task_known = asyncio.Event()
        return self._task_known

    @task_known.setter
    def task_known(self, event: asyncio.Event) -> None:
        self._task_known = event

    @property
    def tasks(self) -> TaskScope:
        """The tasks the call runs upstream (its reader, its answers to the server, its abandon)."""
        if self._tasks is None:
            self._tasks = TaskScope("legacy call")
        return self._tasks

    @tasks.setter
    def tasks(self, scope: TaskScope) -> None:
        self._tasks = scope

    @property
    def busy(self) -> bool:
        """A task of the call still runs."""
        return self._tasks is not None and len(self._tasks) > 0

    @property
    def method(self) -> str:
        return self.machine.state.method

    @property
    def park_id(self) -> str:
        return self.machine.state.park_id

    # ------------------------------------------------------------ events in, actions out

    def feed(self, actions: Sequence[Action]) -> None:
        for action in actions:
            if isinstance(action, _DOWNSTREAM):
                self.outbox.append(action)
                if self._wakeup is not None:
                    self._wakeup.set()
            elif isinstance(action, Release):
                self.finish()
            elif isinstance(action, AnswerServer):
                self.tasks.spawn(self._answer(action.response), name="answer-server")
            elif isinstance(action, StartCollecting):
                self.arm(action.delay_s, self.machine.collect_window_elapsed)
            elif isinstance(action, Detach):
                self.arm(action.timeout_s, self.machine.detach_expired)
            elif isinstance(action, Abandon):
                self.disarm()
                self.relay.unpark(self)
                self.tasks.spawn(self._abandon(action.reason, action.responses), name="abandon")
            else:  # DeliverAnswers: only a retry returns it, and its handler executes it
                raise AssertionError(f"unexpected action {action!r}")

    def arm(self, delay_s: float, event: Callable[[], list[Action]]) -> None:
        self.disarm()
        self._timer = asyncio.get_running_loop().call_later(delay_s, lambda: self.feed(event()))

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ------------------------------------------------------------ the upstream side

    def takes(self, request: JSONDict) -> bool:
        """A server request that came outside any call's stream (the GET stream, stdio) is this
        call's, the one holding the session, unless the server runs the call as a task: then only
        one tagged with that task is (2025-11-25 tasks.mdx: a task's requests MUST carry the
        related-task `_meta`). Servers ask of their own accord too (server-everything lists the
        roots of each new session), and such a request must not end the task's call."""
        if not self.as_task:
            return True
        related = (meta.meta_of(request.get("params")) or {}).get(meta.RELATED_TASK)
        task_id = related.get("taskId") if isinstance(related, dict) else None
        if not isinstance(task_id, str):
            return False
        # Before the reply that creates the task is read, a tagged request can only be its.
        return self.upstream_task_id is None or task_id == self.upstream_task_id

    def bind(self, session: LegacyUpstreamSession) -> None:
        self.session = session
        session.active.add(self)
        if self.upstream_token is not None:
            session.progress_routes[self.upstream_token] = self
        if self.interactive:
            session.exclusive = self

    async def open(self, outgoing: JSONDict, *, again: bool = False) -> tuple[Exchange, Reply]:
        """Send the request: the exchange entered by hand and its reply. Whoever holds the exchange
        leaves it, once: the handler, or the call once the handler handed it over (run_out,
        close_after). A session the upstream forgot (HTTP 404) is opened again and the request
        sent once more (`again`), which is safe: it was not executed (docs/translation.md §4.3).
        A request that cannot be sent at all fails as an UpstreamError, as session.request's do:
        mapped here rather than by its wrapper, a coroutine level less on every call."""
        exchange: Exchange = TaskCall(self, outgoing) if self.as_task else self.session.exchange(outgoing, self.trace)
        try:
            return exchange, await exchange.__aenter__()
        except UpstreamSessionGone:
            if again:
                raise
        except (UpstreamError, TimeoutError):  # a deadline keeps its own meaning
            raise
        except Exception as exc:
            if self.as_task:  # a TaskCall sends on session.request, which maps its own
                raise
            raise unsendable(self.session.name, exc) from None
        try:
            self.bind(await self.relay.pool.replace(self.session))
        except ProxyError as exc:  # it refused to open a session again: still a session gone
            raise UpstreamSessionGone(self.relay.name, f"forgot the session: {exc.message}") from None
        self.relay.count_reinitialized()
        return await self.open(outgoing, again=True)

    def start_reader(self, outgoing: JSONDict) -> None:
        self._reader = self.tasks.spawn(self._read(outgoing), name="legacy-call-reader")

    def run_out(self, messages: Any, exchange: Exchange) -> None:
        """Read the rest of a stream the handler opened, once the client has its answer; the call
        leaves the exchange."""
        self._reader = self.tasks.spawn(_run_out(self, messages, exchange), name="legacy-call-rest")

    async def _read(self, outgoing: JSONDict) -> None:
        try:
            exchange, reply = await self.open(outgoing)
            try:
                await self.consume(reply)
            finally:
                await exchange.__aexit__(None, None, None)
        except UpstreamError as exc:
            self.feed(self.machine.upstream_failed(exc.failure))
        except Exception:
            # Whatever else ends the reader ends the call too: the attached request hears of it
            # now instead of waiting out its deadline for a reader that is gone.
            log.exception("legacy_call_reader_failed", upstream=self.session.name, method=self.method)
            self.feed(self.machine.upstream_failed(_reader_failed(self.session.name)))

    async def consume(self, messages: Reply) -> None:
        """Feed the reply stream to the machine until the call is over."""
        async for message in messages:
            self.feed(self.machine.upstream_message(message))
            if self.machine.phase == "done":
                return
        self.feed(self.machine.upstream_ended())

    async def _answer(self, response: JSONDict) -> None:
        await self.session.send(response)

    async def _abandon(self, reason: str, responses: tuple[JSONDict, ...]) -> None:
        """Answer what the server waits for and tell it to stop, while its stream is still open and
        before the session serves anyone else (some servers mishandle a cancellation for a request
        whose stream already closed); then free the session."""
        try:
            if self.as_task:
                # Given up while the server may still be creating its task: the answer names the
                # task to cancel (a notifications/cancelled would leave it running).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_ABANDON_TIMEOUT_S):
                        await self.task_known.wait()
            with contextlib.suppress(UpstreamError, ProxyError, TimeoutError):
                async with asyncio.timeout(_ABANDON_TIMEOUT_S):
                    for response in responses:
                        await self.session.send(response)
                    if self.upstream_task_id is not None:
                        # A task is cancelled by tasks/cancel, never by notifications/cancelled
                        # (2025-11-25 tasks.mdx); its reply does not matter.
                        request = m2l.task_cancel_request(self.session.next_id(), self.upstream_task_id)
                        async with self.session.request(request, self.trace) as reply:
                            async for _ in reply:
                                pass
                    else:
                        cancel = {"requestId": self.machine.state.upstream_id, "reason": reason}
                        await self.session.send(jsonrpc.notification("notifications/cancelled", cancel))
        finally:
            self.finish()
        log.info("legacy_call_abandoned", upstream=self.session.name, method=self.method, reason=reason)

    def finish(self) -> None:
        """The upstream call is over: free the session (once)."""
        if self.finished:
            return
        self.finished = True
        if self._timer is not None:
            self.disarm()
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()
        session, relay = self.session, self.relay
        if self.upstream_token is not None:
            session.progress_routes.pop(self.upstream_token, None)
        session.active.discard(self)
        if session.exclusive is self:
            session.exclusive = None
        relay.pool.release(session)
        relay.unpark(self)
        relay.forget(self)


def call_taking(session: LegacyUpstreamSession, request: JSONDict) -> LegacyCall | None:
    """The call a server request that came outside any call's stream (the GET stream, stdio) is
    for: the one holding the session, if it takes it (LegacyCall.takes)."""
    call = session.exclusive
    return call if isinstance(call, LegacyCall) and not call.finished and call.takes(request) else None


def call_of_notification(session: LegacyUpstreamSession, note: JSONDict) -> LegacyCall | None:
    """The call a notification that came outside any call's stream is for, if one (the routes
    LegacyCall.bind set on the session)."""
    method = note.get("method")
    params = jsonrpc.params_of(note)
    call: CallSink | None = None
    if method == "notifications/progress":
        token = params.get("progressToken")
        call = session.progress_routes.get(token) if isinstance(token, str) else None
    elif method == "notifications/cancelled":
        call = session.exclusive
    elif method == "notifications/message" and len(session.active) == 1:
        # Without a per-request stream (stdio), a log belongs to the one call running, if one.
        call = next(iter(session.active))
    # Other logs and list changes outside a call's stream have no modern request to go to.
    return call if isinstance(call, LegacyCall) and not call.finished else None


def _reader_failed(upstream: str) -> UpstreamFailure:
    """A reader that failed for a reason of the proxy's own: the client gets -32603; it counts as
    an upstream exchange that ended unexpectedly."""
    return UpstreamFailure(upstream, "unavailable", jsonrpc.INTERNAL_ERROR, "could not be relayed (internal error)")


async def _run_out(call: LegacyCall, messages: Any, exchange: Exchange) -> None:
    """The rest of a detached call's stream, read by the call itself until the call is over."""
    try:
        with contextlib.suppress(UpstreamError):
            async for message in messages:
                call.feed(call.machine.upstream_message(message))
                if call.finished:
                    return
            call.feed(call.machine.upstream_ended())
    finally:
        await exchange.__aexit__(None, None, None)


async def close_after(call: LegacyCall, exchange: Exchange) -> None:
    """Close a call's upstream stream once the call has told the upstream what it had to."""
    try:
        await call.tasks.drain()
    finally:
        await exchange.__aexit__(None, None, None)

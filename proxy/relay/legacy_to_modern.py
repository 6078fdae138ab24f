"""Legacy clients in front of a modern upstream: the backend of the legacy session host that
translates, and the driver of protocol.forwarded_call.

The proxy holds the legacy session itself (relay.legacy_sessions): it answers `initialize` from the
upstream's discover result, answers ping, setLevel and subscriptions itself, and turns every other
request into a stateless 2026-07-28 one (a ForwardedCall), relaying request-scoped notifications as
they arrive and asking the client itself when the upstream needs input (docs/translation.md §3).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from .. import PROXY_INFO, tracing
from ..config import Settings
from ..errors import ProxyError
from ..metrics import Metrics, method_label
from ..protocol import jsonrpc, meta
from ..protocol import legacy_tasks as lt
from ..protocol import legacy_to_modern as l2m
from ..protocol import task_extension as te
from ..protocol.capabilities import extensions_problem, modern_client_capabilities
from ..protocol.forwarded_call import (
    Action,
    AskClient,
    Fail,
    Finish,
    ForwardedCall,
    InputRound,
    Log,
    LookupToolHeaders,
    RelayToClient,
    Renegotiated,
    SendUpstream,
    SuspectEra,
    WithdrawAsks,
    final_message,
    final_reply,
    outcome_message,
)
from ..protocol.methods import CORE_CLIENT_NOTIFICATIONS
from ..protocol.outcome import Outcome, timed_out
from ..protocol.versions import LATEST_MODERN, pick_modern
from ..state.cache import ResponseCache, request_key
from ..state.sessions import LegacySession, SessionStore, StoreUnavailable
from ..upstream.base import Upstream
from ..upstream.errors import UpstreamError, UpstreamProtocolError
from .channel import NO_STREAM, ReplyChannel
from .detect import Handshakes
from .failures import UpstreamFailures, deliver_notification
from .input_rounds import InputRounds
from .legacy_sessions import Opened
from .scopes import Deadline
from .session_listens import Runtime, SessionListens, Translated
from .tasks.host import LegacyTaskHost
from .tasks.legacy_clients import TASK_CANCEL_S, HostedTasks, UpstreamTaskCancels
from .tool_headers import ToolHeaders, unlisted

JSONDict = dict[str, Any]
log = structlog.get_logger(__name__)

# Answered by the proxy itself; never forwarded (docs/translation.md §3.3).
_LOCAL_METHODS = frozenset({"ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe"})


class TranslatingBackend:
    durable = True  # everything a session is lives in the store

    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        store: SessionStore,
        metrics: Metrics,
        cache: ResponseCache | None = None,
        failures: UpstreamFailures | None = None,
        server_ids: Callable[[str, int], str | int] | None = None,
        tasks: LegacyTaskHost | None = None,
        *,
        claimant: str = "",
        on_era_mismatch: Callable[[str], None] = lambda reason: None,
        handshakes: Handshakes | None = None,
    ) -> None:
        """`server_ids(session_id, count)`: the id of the count-th request sent to a session's
        client (replicas.ServerRequestIds.mint: a sealed id naming this replica); the count itself
        without it. `tasks`: the host of 2025-11-25 clients' tasks (None: tasks are not hosted).
        `claimant`: how this replica names itself to answers for rounds it takes over (the session
        host's owner). `on_era_mismatch(reason)`: an answer says the upstream no longer speaks
        2026-07-28 (era re-detection). `handshakes`: told how each `server/discover` went (readiness)."""
        self._settings = settings
        self._rounds = InputRounds(settings, store, server_ids or (lambda session_id, count: count))
        self._claimant = claimant
        self._upstream = upstream
        self._store = store
        self._metrics = metrics
        self._cache = cache if cache is not None else ResponseCache(settings.cache, metrics)
        self._failures = failures if failures is not None else UpstreamFailures(metrics)
        self._upstream_ids = itertools.count(1)
        self._tool_headers = ToolHeaders(upstream.name)
        self._hosted = HostedTasks(tasks, settings.tasks)
        self._on_era_mismatch = on_era_mismatch
        self.handshakes = handshakes if handshakes is not None else Handshakes(upstream.name)
        self._modern_version = LATEST_MODERN
        self._cancels = UpstreamTaskCancels(upstream)
        self._listens = SessionListens(
            settings, upstream, store, metrics, self._cache, self._upstream_ids, self._profile
        )

    # ------------------------------------------------------------ sessions

    async def open(self, message: JSONDict, principal: str, auth_headers: dict[str, str]) -> Opened[Translated]:
        """Answer `initialize` from the upstream's discover result (docs/translation.md §3.1)."""
        params = jsonrpc.params_of(message)
        problem = extensions_problem(jsonrpc.obj(params.get("capabilities")))
        if problem is not None:
            raise ProxyError(jsonrpc.INVALID_PARAMS, f"initialize: {problem}")
        try:
            discover = await self.discover(principal, auth_headers)
        except UpstreamError as exc:
            raise self._failures.client_error(exc) from None
        except TimeoutError:
            raise self._failures.timeout(self._upstream.name) from None
        try:
            legacy, modern, result = l2m.initialize_result(discover, params.get("protocolVersion"), PROXY_INFO)
        except l2m.InitializeRefused as exc:
            raise ProxyError(jsonrpc.INTERNAL_ERROR, str(exc)) from None
        if self._hosted.hosting:
            result = {**result, "capabilities": lt.advertise(jsonrpc.obj(result.get("capabilities")), legacy)}
        return Opened(
            result,
            legacy,
            None,  # made by revive() on the session's first request
            modern_version=modern,
            upstream_capabilities=modern_client_capabilities(jsonrpc.obj(params.get("capabilities")), legacy),
            server_capabilities=jsonrpc.obj(discover.get("capabilities")),
            log_fields={"modern_version": modern},
        )

    def started(self, runtime: Runtime, lost: Callable[[str], None]) -> None:
        pass  # nothing here can lose a session

    def revive(self, session: LegacySession) -> Translated:
        return Translated()

    async def close(self, runtime: Runtime) -> None:
        await self._listens.close(runtime)

    # ------------------------------------------------------------ messages in a session

    async def notify(self, session: LegacySession, runtime: Runtime, message: JSONDict) -> None:
        """A core notification is the proxy's (§3.3); any other, an extension's, goes to the server
        with the headers of its version, as the session's requests do (docs/translation.md §2.1)."""
        method = message["method"]
        if method in CORE_CLIENT_NOTIFICATIONS:
            return
        headers = {**runtime.live.auth_headers, **l2m.upstream_headers(message, session.modern_version)}
        within_s = self._settings.upstream.request_timeout_s
        await deliver_notification(self._upstream.name, method, within_s, self._upstream.send(message, headers))

    async def respond(self, session: LegacySession, runtime: Runtime, message: JSONDict) -> bool:
        request_id = message["id"]
        future = runtime.pending.get(request_id) if isinstance(request_id, (int, str)) else None
        if future is None or future.done():
            return False
        future.set_result(message)
        return True

    async def request(
        self,
        session: LegacySession,
        runtime: Runtime,
        message: JSONDict,
        channel: ReplyChannel,
        auth_headers: dict[str, str],
    ) -> JSONDict:
        runtime.live.auth_headers = auth_headers
        method = message["method"]
        if method in _LOCAL_METHODS:
            return jsonrpc.result_response(message["id"], await self._local(session, runtime, message))
        if self._hosted.takes(session, message):
            return await self._hosted.request(
                session,
                message,
                channel,
                runtime.deliver,
                run_call=lambda call_message, task_channel: self._run_task_call(
                    session, runtime, call_message, task_channel, auth_headers
                ),
            )
        if method in lt.TASK_METHODS:  # no 2026-07-28 method of that name: nothing to ask upstream
            raise ProxyError(jsonrpc.METHOD_NOT_FOUND, f"Method not found: {method} (this proxy hosts no tasks here)")
        key = self._cache.key_for(method, message.get("params"), session.modern_version, session.upstream_capabilities)
        if key is None:  # most calls: straight through (here: one await level less), nothing to share
            call = self._new_call(session, message, channel.can_stream, auth_headers)
            finish = await self._drive(call, session, runtime, channel, auth_headers)
            reply = final_reply(message, finish, session.legacy_version)
        else:
            reply = await self._cached(key, session, runtime, message, channel, auth_headers)
        return self._hosted.listed(session, method, reply)

    async def _run_task_call(
        self,
        session: LegacySession,
        runtime: Runtime,
        message: JSONDict,
        channel: ReplyChannel,
        auth_headers: dict[str, str],
    ) -> Finish:
        """The call of a task hosted for a 2025-11-25 client (relay.tasks.legacy_clients)."""
        call = self._new_call(session, message, channel.can_stream, auth_headers)
        # A task may outlive its token: each exchange goes with the session's latest credentials
        # (the same caller's refreshed token, from its tasks/result or any other request).
        return await self._drive(call, session, runtime, channel, auth_headers, latest=runtime.live)

    async def _local(self, session: LegacySession, runtime: Runtime, message: JSONDict) -> JSONDict:
        method = message["method"]
        params = jsonrpc.params_of(message)
        if method == "ping":
            return {}
        if method == "logging/setLevel":
            level = params.get("level")
            if level not in meta.LOG_LEVELS:
                raise ProxyError(jsonrpc.INVALID_PARAMS, f"unknown log level {level!r}")
            session.log_level = level
            await self._store.save(session, ("log_level",))
            return {}
        uri = params.get("uri")
        if not isinstance(uri, str) or not uri:
            raise ProxyError(jsonrpc.INVALID_PARAMS, f"{method} needs a uri")
        if method == "resources/subscribe":
            await self._listens.subscribe(session, runtime, uri)
        else:  # resources/unsubscribe
            await self._listens.unsubscribe(session, runtime, uri)
        return {}

    # ------------------------------------------------------------ forwarding

    def _profile(self, session: LegacySession) -> l2m.ClientProfile:
        return l2m.ClientProfile(
            session.modern_version, session.upstream_capabilities, session.client_info, session.log_level
        )

    async def _cached(
        self,
        key: tuple[Any, ...],
        session: LegacySession,
        runtime: Runtime,
        message: JSONDict,
        channel: ReplyChannel,
        auth_headers: dict[str, str],
    ) -> JSONDict:
        """A cacheable request (its `key`): from the response cache, or forwarded and kept."""
        method = message["method"]

        async def load() -> Outcome:
            call = self._new_call(session, message, channel.can_stream, auth_headers)
            finish = await self._drive(call, session, runtime, channel, auth_headers)
            return Outcome(outcome_message(finish), shareable=finish.cacheable)

        reply = (await self._cache.fetch(key, session.principal, load)).message
        if method == "tools/list" and isinstance(reply.get("result"), dict):
            reply = {**reply, "result": self._tool_headers.learn(session.principal, reply["result"])}
        return final_message(message, reply, session.legacy_version)

    def _new_call(
        self, session: LegacySession, message: JSONDict, can_stream: bool, auth_headers: Mapping[str, str]
    ) -> ForwardedCall:
        profile = self._profile(session)
        if (
            message.get("method") in te.TASK_METHODS
            and self._settings.tasks.follow_upstream
            and te.declared(session.server_capabilities)
        ):
            # The upstream may answer with a task of its own; the call then follows it
            # (io.modelcontextprotocol/tasks extension (specification/draft/tasks.md)).
            profile = dataclasses.replace(profile, capabilities=te.with_extension(profile.capabilities))
        return ForwardedCall.new(
            message,
            profile,
            session.legacy_version,
            tag=str(next(self._upstream_ids)),
            upstream=self._upstream.name,
            can_stream=can_stream,
            max_rounds=self._settings.input.max_rounds,
            trace=meta.trace_of(auth_headers) if auth_headers else None,
            poll_interval_ms=self._settings.tasks.poll_interval_ms,
        )

    async def _drive(
        self,
        call: ForwardedCall,
        session: LegacySession,
        runtime: Runtime | None,
        channel: ReplyChannel,
        auth_headers: Mapping[str, str],
        resumed: list[Action] | None = None,
        latest: Translated | None = None,
    ) -> Finish:
        """Execute the call's actions until it finishes (from its start, or from where a round
        taken over left it); an upstream failure raises its ProxyError. With `latest`, each
        exchange goes with the credentials that session part last had."""
        credentials = meta.without_trace(auth_headers) if auth_headers else {}
        # The actions are run here, not in a coroutine of their own: each await level costs
        # every suspension of the call (an upstream reply is awaited at the bottom of it).
        try:
            actions = deque(call.start() if resumed is None else resumed)
            while actions:
                action = actions.popleft()
                # The common case first: one request upstream, then its result.
                if type(action) is SendUpstream:
                    if action.delay_s:
                        await asyncio.sleep(action.delay_s)
                    if latest is not None:
                        credentials = meta.without_trace(latest.auth_headers)
                    actions.extend(await self._exchange(call, action, credentials, channel))
                    continue
                if type(action) is Finish:
                    return action
                match action:
                    case LookupToolHeaders(tool=tool, refresh=refresh):
                        if refresh:
                            self._tool_headers.forget(session.principal)
                        known = self._tool_headers.known(session.principal, tool)
                        if known is None:
                            known = await self._tool_headers.fetch(
                                session.principal, tool, functools.partial(self._list_tools, session, auth_headers)
                            )
                        actions.extend(call.tool_headers(known))
                    case AskClient(asks=asks):
                        assert runtime is not None  # only a call that can stream asks, and such a call has a session
                        actions.extend(await self._rounds.ask(call, runtime, channel, asks))
                        await channel.answered()
                    case RelayToClient(message=note):
                        await channel.send(note)
                    case Renegotiated(version=version):
                        self._cache.clear("version_renegotiated")
                        session.modern_version = version
                        try:
                            await self._store.save(session, ("modern_version",))
                        except StoreUnavailable:  # other replicas renegotiate for themselves
                            log.warning("renegotiated_version_not_shared", version=version)
                    case SuspectEra(reason=reason):
                        self._on_era_mismatch(reason)
                    case InputRound():
                        self._metrics.input_rounds.labels("legacy_to_modern", method_label(call.method)).inc()
                        tracing.input_round()
                    case Log():
                        self._log(action)
                    case Fail(failure=failure):
                        raise self._failures.client_error(failure)
                    case WithdrawAsks():
                        pass  # withdrawn where the asks are awaited (InputRounds.ask)
            raise AssertionError("a forwarded call ended without finishing")  # pragma: no cover
        finally:
            # Given up (the client cancelled, a round timed out, the proxy stops...) while the
            # upstream still runs a task for it: that task is cancelled, best effort.
            cancel = call.cancel_task()
            if cancel is not None:
                if latest is not None:
                    credentials = meta.without_trace(latest.auth_headers)
                self._cancels.spawn(cancel, credentials)

    async def _exchange(
        self, call: ForwardedCall, send: SendUpstream, credentials: Mapping[str, str], channel: ReplyChannel
    ) -> list[Action]:
        """Send one upstream request and feed what comes back to the call; relay its notifications
        as they arrive. Returns the actions that follow the reply."""
        headers = {**credentials, **send.headers} if credentials else send.headers
        attempt = call.state.attempt  # names the request sent (upstream_id), read without building it
        # A hosted task's call may take as long as the task is kept; a request's, its own bound.
        bound_s = channel.exchange_bound_s(self._settings.upstream.request_timeout_s)
        try:
            with Deadline(bound_s):
                async with self._upstream.exchange(send.message, headers) as messages:
                    async for incoming in messages:
                        actions = call.upstream_message(incoming)
                        # The reply: what follows it (the call may await the next request already).
                        if not call.awaiting_upstream or call.state.attempt != attempt:
                            return actions
                        for action in actions:  # a notification, or a request dropped
                            if isinstance(action, RelayToClient):
                                await channel.send(action.message)
                            elif isinstance(action, Log):
                                self._log(action)
        except UpstreamError as exc:
            return call.upstream_failed(exc.failure)
        except TimeoutError:
            return call.upstream_failed(timed_out(self._upstream.name))
        return call.upstream_ended()

    def _log(self, action: Log) -> None:
        getattr(log, action.level)(action.event, upstream=self._upstream.name, **action.fields)

    async def settle_cancels(self, timeout_s: float = TASK_CANCEL_S) -> None:
        """Shutdown: the tasks/cancel requests under way get a bounded moment, then end."""
        await self._cancels.settle(timeout_s)

    # ------------------------------------------------------------ x-mcp-header

    async def _list_tools(self, session: LegacySession, auth_headers: Mapping[str, str], params: JSONDict) -> JSONDict:
        """One tools/list page asked for the session's caller, to learn its tools' annotations."""
        call = self._new_call(session, jsonrpc.request(0, "tools/list", params), False, auth_headers)
        finish = await self._drive(call, session, None, NO_STREAM, auth_headers)
        if finish.result is None:
            raise unlisted(finish.error)
        return finish.result

    # ------------------------------------------------------------ input rounds taken over

    async def resume(
        self,
        session: LegacySession,
        runtime: Runtime,
        request_id: Any,
        seen_seq: int,
        channel: ReplyChannel,
        auth_headers: dict[str, str],
    ) -> JSONDict | None:
        """Carry on the open input round of a request whose stream broke on another replica (its
        client resumed the stream here); None: there is none to carry on."""
        taken = await self._rounds.claim(session.id, request_id, self._claimant)
        if taken is None:
            return None
        runtime.live.auth_headers = auth_headers
        actions = await self._rounds.carry_on(taken, runtime, seen_seq, channel)
        finish = await self._drive(taken.call, session, runtime, channel, auth_headers, actions)
        return final_reply(taken.call.state.request, finish, session.legacy_version)

    # ------------------------------------------------------------ GET stream and listen

    def get_stream_opened(
        self, session: LegacySession, runtime: Runtime, moved: bool, auth_headers: dict[str, str] | None
    ) -> asyncio.Future[Any] | None:
        return self._listens.stream_opened(session, runtime, moved, auth_headers)

    # ------------------------------------------------------------ discover

    async def discover(self, principal: str = "", auth_headers: Mapping[str, str] | None = None) -> JSONDict:
        """The upstream's DiscoverResult, from the cache while fresh (legacy initialize uses it)."""

        async def load() -> Outcome:
            return Outcome({"jsonrpc": "2.0", "result": await self._fetch_discover(auth_headers or {})})

        key = request_key("server/discover", {}, self._modern_version, {})
        result: JSONDict = (await self._cache.fetch(key, principal, load)).message["result"]
        return result

    @property
    def upstream(self) -> Upstream:
        return self._upstream

    @property
    def modern_version(self) -> str:
        return self._modern_version

    async def probe(self) -> JSONDict:
        """Ask the upstream directly (no cache): used by readiness."""
        return await self._fetch_discover({})

    async def _fetch_discover(self, auth_headers: Mapping[str, str]) -> JSONDict:
        """The upstream's DiscoverResult, asked now: the handshake of a 2026-07-28 upstream."""
        try:
            result = await self._ask_discover(auth_headers)
        except Exception as exc:
            self.handshakes.failed(exc)
            raise
        self.handshakes.worked()
        return result

    async def _ask_discover(self, auth_headers: Mapping[str, str]) -> JSONDict:
        version = self._modern_version
        for _ in range(2):
            outgoing = jsonrpc.request(
                f"discover-{next(self._upstream_ids)}",
                "server/discover",
                {"_meta": l2m.request_meta(l2m.ClientProfile(version, {}, PROXY_INFO))},
            )
            headers = {**auth_headers, **l2m.upstream_headers(outgoing, version)}
            async with asyncio.timeout(self._settings.readiness.probe_timeout_s * 3):
                async with self._upstream.exchange(outgoing, headers) as messages:
                    reply = None
                    async for incoming in messages:
                        if "method" not in incoming:
                            reply = incoming
                            break
            if reply is None:
                raise UpstreamProtocolError(self._upstream.name, "sent no reply to server/discover")
            error = reply.get("error")
            if isinstance(error, dict) and error.get("code") == jsonrpc.UNSUPPORTED_PROTOCOL_VERSION:
                data = jsonrpc.obj(error.get("data"))
                picked = pick_modern(data.get("supported"))
                if picked is None:
                    break
                # Asked again once with the version offered, even the one just asked for: a server
                # may refuse a first request and take the same version next, as a modern client
                # would try it (docs/translation.md §3.1).
                version = self._modern_version = picked
                continue
            result = reply.get("result")
            if isinstance(result, dict) and isinstance(result.get("supportedVersions"), list):
                return result
            raise UpstreamProtocolError(
                self._upstream.name, f"answered server/discover with {str(error or result)[:200]}"
            )
        raise UpstreamProtocolError(self._upstream.name, "supports no protocol version this proxy speaks")

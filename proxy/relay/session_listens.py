"""What the legacy sessions of a 2026-07-28 upstream hear between their requests
(docs/translation.md §3.7).

One upstream `subscriptions/listen` per caller (CallerListen), shared by every session of that
caller on this replica that needs one: it asks for the union of what they want (list changes once
a session opened a GET stream, the resources each one subscribed to), and each notification goes to
the sessions that want it (`wants`, the one rule of who hears what). Callers never share a listen:
it is keyed by the principal, and by what the listen request tells upstream about the client
(ListenKey). The last session leaving closes it; a changed union re-listens (relay/listen.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import orjson

from ..config import Settings
from ..errors import ProxyError
from ..metrics import Metrics
from ..protocol import jsonrpc, meta
from ..protocol import legacy_to_modern as l2m
from ..protocol.methods import LIST_CHANGED
from ..state.cache import ResponseCache
from ..state.sessions import LegacySession, SessionStore
from ..upstream.base import Upstream
from ..upstream.errors import UpstreamError
from .listen import UpstreamListener, listen_request
from .runtime import SessionRuntime
from .scopes import TaskScope

JSONDict = dict[str, Any]
_LIST_CHANGED_KEY = {method: key for key, (_, method) in LIST_CHANGED.items()}
_UPDATED = "notifications/resources/updated"


class Translated:
    """The backend's live part of one session: the caller's listen it joined, and its credentials."""

    __slots__ = ("auth_headers", "list_changes", "listen")

    def __init__(self) -> None:
        self.listen: CallerListen | None = None  # joined on demand
        self.list_changes = False  # the session wants list_changed (it opened a GET stream)
        self.auth_headers: dict[str, str] = {}  # the caller's latest credentials, for background calls


Runtime = SessionRuntime[Translated]


def wants(session: LegacySession, list_changes: bool, note: JSONDict) -> bool:
    """Whether a session hears a notification of its caller's listen: a resource's update only
    while it subscribes to that resource (exact URI), a list change only of a list its own filter
    asks for (it opened a GET stream, and the upstream advertises `listChanged` for that list)."""
    method = note.get("method")
    if method == _UPDATED:
        return jsonrpc.params_of(note).get("uri") in session.subscriptions
    key = _LIST_CHANGED_KEY.get(method) if isinstance(method, str) else None
    return key is not None and key in l2m.listen_filter(session.server_capabilities, frozenset(), list_changes)


def covers(asked: JSONDict, wanted: JSONDict) -> bool:
    """Whether a listen asking for `asked` carries everything of `wanted`."""
    for key, value in wanted.items():
        if key == "resourceSubscriptions":
            if not set(value) <= set(asked.get(key) or ()):
                return False
        elif value and not asked.get(key):
            return False
    return True


@dataclass(frozen=True, slots=True)
class ListenKey:
    """What sessions sharing one upstream listen have in common: the caller, and what the listen
    request says about the client (its version and capabilities)."""

    principal: str
    modern_version: str
    capabilities: bytes  # canonical JSON

    @classmethod
    def of(cls, session: LegacySession) -> ListenKey:
        capabilities = orjson.dumps(session.upstream_capabilities, option=orjson.OPT_SORT_KEYS)
        return cls(session.principal, session.modern_version, capabilities)


@dataclass(eq=False, slots=True)
class _Member:
    runtime: Runtime
    joined_as: LegacySession

    def state(self) -> LegacySession:
        """The session as last loaded here: with a shared store each request loads it afresh, and a
        subscription may have changed through another replica."""
        current = self.runtime.session
        return current if isinstance(current, LegacySession) else self.joined_as


class CallerListen:
    """One upstream listen shared by the sessions of one caller (`key`) on this replica."""

    def __init__(
        self,
        key: ListenKey,
        first: _Member,
        open_stream: Callable[[CallerListen, JSONDict], Any],  # (listen, filter) -> async context manager
        invalidate: Callable[[JSONDict], object],
        retry_max_s: float,
        on_stream_change: Callable[[int], None],
    ) -> None:
        self.key = key
        self.members: dict[str, _Member] = {}
        self._recent = first  # whose credentials go upstream when no member is left to ask
        self._invalidate = invalidate
        self._tasks = TaskScope("caller listen")
        self._renewal: asyncio.Task[Any] | None = None
        self._renew_again = False
        self.listener = UpstreamListener(
            open_stream=lambda filter_: open_stream(self, filter_),
            current_filter=self.filter,
            deliver=self.fan_out,
            retry_max_s=retry_max_s,
            on_stream_change=on_stream_change,
        )

    def join(self, member: _Member) -> None:
        self.members[member.runtime.session_id] = member
        self._recent = member

    def leave(self, runtime: Runtime) -> bool:
        """The session left; True when it was the last one (the listen must close)."""
        member = self.members.get(runtime.session_id)
        if member is not None and member.runtime is runtime:
            del self.members[runtime.session_id]
        if self.members:
            self.renew_later()  # the union may be narrower now
        return not self.members

    def latest(self) -> _Member:
        """The member served most recently here: its credentials are the caller's latest."""
        if self.members:
            self._recent = max(self.members.values(), key=lambda member: member.runtime.last_used)
        return self._recent

    def filter(self) -> JSONDict:
        """The union of what the members want: list changes if any opened a GET stream, every
        resource any of them subscribes to."""
        uris: set[str] = set()
        list_changes = False
        capabilities: object = None
        for member in self.members.values():
            session = member.state()
            uris |= session.subscriptions
            list_changes = list_changes or member.runtime.live.list_changes
            capabilities = session.server_capabilities
        return l2m.listen_filter(capabilities, uris, list_changes)

    def fan_out(self, message: JSONDict) -> None:
        """One notification of the listen, to each member that wants it."""
        self._invalidate(message)
        note = l2m.strip_subscription_id(message)
        for member in list(self.members.values()):
            if wants(member.state(), member.runtime.live.list_changes, note):
                member.runtime.deliver(note)

    async def serve(self, wanted: JSONDict) -> JSONDict:
        """The acknowledgement of a listen carrying `wanted`: the running one if it does, else a
        re-listen to the members' union."""
        running = self.listener.running()
        if running is not None and covers(running[0], wanted):
            return await asyncio.shield(running[1])
        return await self.listener.refresh()

    def renew_later(self) -> None:
        """Re-listen to the union in the background (once, whatever changed meanwhile)."""
        self._renew_again = True
        if (self._renewal is None or self._renewal.done()) and not self._tasks.closed:
            self._renewal = self._tasks.spawn(self._renew(), name="re-listen")

    async def _renew(self) -> None:
        while self._renew_again:
            self._renew_again = False
            await self.listener.refresh()

    async def close(self) -> None:
        await self._tasks.aclose()
        await self.listener.close()


class SessionListens:
    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        store: SessionStore,
        metrics: Metrics,
        cache: ResponseCache,
        upstream_ids: Iterator[int],
        profile: Callable[[LegacySession], l2m.ClientProfile],
    ) -> None:
        """`upstream_ids`: numbers for the ids of requests sent upstream (shared with the calls);
        `profile(session)`: the client the session's requests describe upstream."""
        self._settings = settings
        self._upstream = upstream
        self._store = store
        self._metrics = metrics
        self._cache = cache
        self._upstream_ids = upstream_ids
        self._profile = profile
        self._by_caller: dict[ListenKey, CallerListen] = {}

    def __len__(self) -> int:
        """How many upstream listens (callers) are held here."""
        return len(self._by_caller)

    async def subscribe(self, session: LegacySession, runtime: Runtime, uri: str) -> None:
        """resources/subscribe: kept once the caller's listen acknowledges it."""
        resources = session.server_capabilities.get("resources")
        if not (isinstance(resources, dict) and resources.get("subscribe")):
            raise ProxyError(jsonrpc.METHOD_NOT_FOUND, "the upstream does not support resource subscriptions")
        session.subscriptions = session.subscriptions | {uri}
        await self._store.save(session, ("subscriptions",))
        # The state just saved is the session's latest: another request of the session resolved
        # while the save was awaited has made its own copy, read before it, the runtime's, and the
        # listen's filter (what its members' runtimes hold) would leave this subscription out.
        runtime.session = session
        try:
            try:
                ack = await self._listen(session, runtime).serve({"resourceSubscriptions": [uri]})
            except (UpstreamError, TimeoutError) as exc:
                raise ProxyError(jsonrpc.INTERNAL_ERROR, f"could not subscribe upstream: {exc}") from None
            if uri not in (ack.get("resourceSubscriptions") or ()):
                raise ProxyError(jsonrpc.INTERNAL_ERROR, f"the upstream did not acknowledge a subscription to {uri}")
        except ProxyError:
            session.subscriptions = session.subscriptions - {uri}
            await self._store.save(session, ("subscriptions",))
            raise

    async def unsubscribe(self, session: LegacySession, runtime: Runtime, uri: str) -> None:
        """resources/unsubscribe: filtered for the session at once (`wants`); the caller's listen
        narrows in the background."""
        session.subscriptions = session.subscriptions - {uri}
        await self._store.save(session, ("subscriptions",))
        runtime.session = session  # the latest state, as in subscribe
        if runtime.live.listen is not None:
            runtime.live.listen.renew_later()

    def stream_opened(
        self, session: LegacySession, runtime: Runtime, moved: bool, auth_headers: dict[str, str] | None
    ) -> asyncio.Future[Any] | None:
        """The session's GET stream opened (`moved`: it was on another replica before): the session
        wants list changes from now on; what runs for it, if anything starts."""
        if auth_headers is not None:
            # The caller's listen (re)opens with the latest credentials: a stream opened before any
            # request, or after a refresh, has them.
            runtime.live.auth_headers = auth_headers
        if not runtime.live.list_changes or moved:
            runtime.live.list_changes = True
            return runtime.tasks.spawn(self._listen_for_stream(session, runtime, moved), name="listen")
        return None

    async def close(self, runtime: Runtime) -> None:
        """The session ended here: it leaves its caller's listen, which closes with its last session."""
        listen, runtime.live.listen = runtime.live.listen, None
        if listen is not None and listen.leave(runtime) and self._by_caller.get(listen.key) is listen:
            del self._by_caller[listen.key]
            await listen.close()

    async def _listen_for_stream(self, session: LegacySession, runtime: Runtime, moved: bool) -> None:
        listen = self._listen(session, runtime)
        ack = await listen.serve(l2m.listen_filter(session.server_capabilities, frozenset(), True))
        if moved:
            # The stream was on another replica: what its listen saw since cannot be replayed,
            # so the client is told to refetch what it listens to (docs/design.md §Replicas).
            current = runtime.session if isinstance(runtime.session, LegacySession) else session
            for note in l2m.gap_notifications(ack):
                if wants(current, runtime.live.list_changes, note):
                    runtime.deliver(note)

    def _listen(self, session: LegacySession, runtime: Runtime) -> CallerListen:
        """The listen of the session's caller, joined (opened by its first session)."""
        live = runtime.live
        if live.listen is not None:
            return live.listen
        key = ListenKey.of(session)
        member = _Member(runtime, session)
        listen = self._by_caller.get(key)
        if listen is None:
            listen = self._by_caller[key] = CallerListen(
                key,
                member,
                self._open_stream,
                self._cache.invalidate_for,
                self._settings.streams.listen_retry_max_s,
                lambda delta: self._metrics.streams_open.labels("upstream_listen").inc(delta),
            )
        listen.join(member)
        live.listen = listen
        return listen

    @asynccontextmanager
    async def _open_stream(self, listen: CallerListen, filter_: JSONDict) -> AsyncIterator[AsyncIterator[JSONDict]]:
        """One upstream listen request for `listen`, with the caller's latest credentials. The
        request describes the client as its sessions do, but for the log level: the listen carries
        no logs, and the sessions of one caller may each have their own."""
        latest = listen.latest()
        session = latest.state()
        profile = dataclasses.replace(self._profile(session), modern_version=listen.key.modern_version, log_level=None)
        outgoing = listen_request(f"listen-{next(self._upstream_ids)}", filter_, l2m.request_meta(profile))
        credentials = meta.without_trace(latest.runtime.live.auth_headers)
        headers = {**credentials, **l2m.upstream_headers(outgoing, profile.modern_version)}
        async with self._upstream.exchange(outgoing, headers) as messages:
            yield aiter(messages)

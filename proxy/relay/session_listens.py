"""What a legacy session of a 2026-07-28 upstream hears between its requests: one upstream
`subscriptions/listen` per session (relay.listen.SessionListener), asking for the resources the
session subscribed to and, once it opened a GET stream, for list changes; what it hears goes to
the session's stream (docs/translation.md §3.7)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

from ..config import Settings
from ..errors import ProxyError
from ..metrics import Metrics
from ..protocol import jsonrpc
from ..protocol import legacy_to_modern as l2m
from ..state.cache import ResponseCache
from ..state.sessions import LegacySession, SessionStore
from ..upstream.base import Upstream
from ..upstream.errors import UpstreamError
from .listen import SessionListener, listen_request
from .runtime import SessionRuntime

JSONDict = dict[str, Any]


class Translated:
    """The backend's live part of one session: its upstream listen and the caller's credentials."""

    __slots__ = ("auth_headers", "list_changes", "listener")

    def __init__(self) -> None:
        self.listener: SessionListener | None = None  # created on demand
        self.list_changes = False  # the session wants list_changed (it opened a GET stream)
        self.auth_headers: dict[str, str] = {}  # the caller's latest credentials, for background calls


Runtime = SessionRuntime[Translated]


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

    async def subscribe(self, session: LegacySession, runtime: Runtime, uri: str) -> None:
        """resources/subscribe: kept once the upstream's listen acknowledges it."""
        resources = session.server_capabilities.get("resources")
        if not (isinstance(resources, dict) and resources.get("subscribe")):
            raise ProxyError(jsonrpc.METHOD_NOT_FOUND, "the upstream does not support resource subscriptions")
        session.subscriptions = session.subscriptions | {uri}
        await self._store.save(session, ("subscriptions",))
        try:
            try:
                ack = await self._listener(session, runtime).refresh()
            except (UpstreamError, TimeoutError) as exc:
                raise ProxyError(jsonrpc.INTERNAL_ERROR, f"could not subscribe upstream: {exc}") from None
            if uri not in (ack.get("resourceSubscriptions") or ()):
                raise ProxyError(jsonrpc.INTERNAL_ERROR, f"the upstream did not acknowledge a subscription to {uri}")
        except ProxyError:
            session.subscriptions = session.subscriptions - {uri}
            await self._store.save(session, ("subscriptions",))
            raise

    async def unsubscribe(self, session: LegacySession, runtime: Runtime, uri: str) -> None:
        """resources/unsubscribe: filter locally at once, re-listen in the background."""
        session.subscriptions = session.subscriptions - {uri}
        await self._store.save(session, ("subscriptions",))
        if runtime.live.listener is not None:
            runtime.tasks.spawn(runtime.live.listener.refresh(), name="re-listen")

    def stream_opened(
        self, session: LegacySession, runtime: Runtime, moved: bool, auth_headers: dict[str, str] | None
    ) -> asyncio.Future[Any] | None:
        """The session's GET stream opened (`moved`: it was on another replica before): the listen
        asks for list changes from now on; what runs for it, if anything starts."""
        if auth_headers is not None:
            # The upstream listen this stream is fed from (re)opens with the GET's credentials:
            # a stream opened before any request, or after a refresh, has the caller's latest.
            runtime.live.auth_headers = auth_headers
        if not runtime.live.list_changes:
            runtime.live.list_changes = True
            return runtime.tasks.spawn(self._listen_for_stream(session, runtime, moved), name="listen")
        if moved:
            return runtime.tasks.spawn(self._listen_for_stream(session, runtime, moved), name="listen")
        return None

    async def _listen_for_stream(self, session: LegacySession, runtime: Runtime, moved: bool) -> None:
        ack = await self._listener(session, runtime).refresh()
        if moved:
            # The stream was on another replica: what its listen saw since cannot be replayed,
            # so the client is told to refetch (docs/design.md §Replicas).
            for note in l2m.gap_notifications(ack):
                runtime.deliver(note)

    def _listener(self, session: LegacySession, runtime: Runtime) -> SessionListener:
        live = runtime.live
        if live.listener is None:

            def state() -> LegacySession:
                # The session as last loaded here: with a shared store each request loads it
                # afresh, and a subscription may have changed through another replica.
                current = runtime.session
                return current if isinstance(current, LegacySession) else session

            def current_filter() -> JSONDict:
                current = state()
                return l2m.listen_filter(current.server_capabilities, current.subscriptions, live.list_changes)

            def deliver(message: JSONDict) -> None:
                self._cache.invalidate_for(message)
                note = l2m.strip_subscription_id(message)
                if note.get("method") == "notifications/resources/updated":
                    params = jsonrpc.params_of(note)
                    if params.get("uri") not in state().subscriptions:
                        return  # unsubscribed meanwhile: filter locally until the re-listen lands
                runtime.deliver(note)

            @asynccontextmanager
            async def open_stream(filter_: JSONDict) -> AsyncIterator[AsyncIterator[JSONDict]]:
                upstream_id = f"listen-{next(self._upstream_ids)}"
                current = state()
                outgoing = listen_request(upstream_id, filter_, l2m.request_meta(self._profile(current)))
                headers = {**live.auth_headers, **l2m.upstream_headers(outgoing, current.modern_version)}
                async with self._upstream.exchange(outgoing, headers) as messages:
                    yield aiter(messages)

            live.listener = SessionListener(
                open_stream=open_stream,
                current_filter=current_filter,
                deliver=deliver,
                retry_max_s=self._settings.streams.listen_retry_max_s,
                on_stream_change=lambda d: self._metrics.streams_open.labels("upstream_listen").inc(d),
            )
        return live.listener

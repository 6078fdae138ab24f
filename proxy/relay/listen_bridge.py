"""A modern client's `subscriptions/listen` over a legacy upstream (docs/translation.md §4.6): the
GET stream of a legacy session of its own, relayed by relay/modern_to_legacy.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from typing import Any, Protocol

import structlog

from ..errors import ProxyError
from ..protocol import jsonrpc
from ..protocol import legacy_tasks as lt
from ..protocol import modern_tasks as mt
from ..protocol import modern_to_legacy as m2l
from ..protocol import task_extension as te
from ..protocol.modern_validate import ModernRequest
from ..upstream.errors import UpstreamError
from ..upstream.legacy_session import LegacyUpstreamSession, SessionPool
from .failures import UpstreamFailures
from .tasks.host import LegacyTaskHost, refusals

JSONDict = dict[str, Any]
log = structlog.get_logger(__name__)

_SUBSCRIBE_TIMEOUT_S = 10.0


class ListenOwner(Protocol):
    """What a ListenBridge needs of the relay that opens it."""

    @property
    def name(self) -> str: ...  # the upstream's

    @property
    def pool(self) -> SessionPool: ...

    @property
    def failures(self) -> UpstreamFailures: ...

    @property
    def hosted_tasks(self) -> LegacyTaskHost | None: ...

    @property
    def listens(self) -> set[ListenBridge]: ...  # the bridges open, ended at shutdown

    def on_server_request(self, session: LegacyUpstreamSession, request: JSONDict) -> None: ...

    def invalidate_for(self, note: JSONDict) -> None: ...


class ListenBridge:
    """One modern `subscriptions/listen` stream over a legacy session of its own (docs/translation.md §4.6).

    The dedicated session's GET stream carries the list changes; `resources/subscribe` adds
    the URIs. Everything relayed is tagged with the subscription id, and only what was asked
    for and acknowledged is relayed.
    """

    def __init__(
        self, relay: ListenOwner, request: ModernRequest, principal: str, auth_headers: dict[str, str]
    ) -> None:
        self._relay = relay
        self._request = request
        self._principal = principal
        self._auth_headers = auth_headers
        self.subscription_id = request.message["id"]
        self.queue: asyncio.Queue[JSONDict | None] = asyncio.Queue()
        self.honored: JSONDict = {}
        self._session: LegacyUpstreamSession | None = None
        self._unwatch: Callable[[], None] = lambda: None

    # SessionOwner: what the dedicated session's GET stream brings.
    def on_server_request(self, session: LegacyUpstreamSession, request: JSONDict) -> None:
        self._relay.on_server_request(session, request)  # nobody to ask: ping answered, others refused

    def on_notification(self, session: LegacyUpstreamSession, note: JSONDict) -> None:
        self._relay.invalidate_for(note)
        out = m2l.listen_notification(note, self.honored, self.subscription_id)
        if out is not None:
            self.queue.put_nowait(out)

    async def open(self) -> JSONDict:
        """Open the upstream side; returns the acknowledgement to send first."""
        params = self._request.message.get("params") or {}
        wanted = params.get("notifications")
        if not isinstance(wanted, dict):
            raise ProxyError(jsonrpc.INVALID_PARAMS, "subscriptions/listen needs a notifications filter", refused=True)
        watched: list[lt.TaskRecord] = []
        if "taskIds" in wanted:
            if not te.declared(self._request.capabilities):
                raise ProxyError(
                    jsonrpc.MISSING_REQUIRED_CAPABILITY, mt.MISSING_MESSAGE, refused=True, data=mt.MISSING_DATA
                )
            with refusals():
                task_ids = mt.listened_task_ids(wanted)
            tasks = self._relay.hosted_tasks
            # Only the caller's own tasks, running or kept, are acknowledged (and then followed).
            watched = await tasks.known(self._principal, task_ids) if tasks is not None else []
        uris = wanted.get("resourceSubscriptions", [])
        if not isinstance(uris, list) or not all(isinstance(u, str) for u in uris):
            raise ProxyError(jsonrpc.INVALID_PARAMS, "resourceSubscriptions must be a list of URIs", refused=True)
        try:
            session = await self._relay.pool.open_dedicated(
                self._request.capabilities, self._request.client_info, self._auth_headers, owner=self, push_wait_s=0.25
            )
        except UpstreamError as exc:
            raise self._relay.failures.client_error(exc) from None
        self._session = session
        self._relay.listens.add(self)
        subscribed: list[str] = []
        resources = session.server_capabilities.get("resources")
        if uris and isinstance(resources, dict) and resources.get("subscribe") and session.push_channel:
            for uri in uris:
                try:
                    await session.call("resources/subscribe", {"uri": uri}, timeout_s=_SUBSCRIBE_TIMEOUT_S)
                    subscribed.append(uri)
                except (UpstreamError, ProxyError, TimeoutError) as exc:
                    log.info("upstream_subscribe_refused", upstream=self._relay.name, error=str(exc))
        self.honored = m2l.honored_filter(wanted, session.server_capabilities, session.push_channel, subscribed)
        if watched and self._relay.hosted_tasks is not None:
            self.honored["taskIds"] = [record.task_id for record in watched]
            self._unwatch = self._relay.hosted_tasks.watch(self._principal, watched, self._task_changed)
        return m2l.acknowledgement(self.honored, self.subscription_id)

    async def relayed(self, keepalive_s: float) -> AsyncGenerator[JSONDict, None]:
        """The acknowledgement, then what the session's GET stream brings that was asked for. It
        ends when the session is gone (the client may listen again) or, at shutdown, with its
        completion result."""
        yield await self.open()
        while True:
            try:
                async with asyncio.timeout(keepalive_s):
                    message = await self.queue.get()
            except TimeoutError:
                if not self.alive:
                    return
                continue
            if message is None:
                yield m2l.listen_closed(self.subscription_id)
                return
            yield message

    def _task_changed(self, record: lt.TaskRecord) -> None:
        self.queue.put_nowait(mt.notification(record, self.subscription_id))

    async def close(self) -> None:
        session = self._session
        self._unwatch()
        self._relay.listens.discard(self)
        if session is None or session.closed:
            return
        with contextlib.suppress(UpstreamError, ProxyError, TimeoutError):
            for uri in self.honored.get("resourceSubscriptions", ()):
                await session.call("resources/unsubscribe", {"uri": uri}, timeout_s=5.0)
        await self._relay.pool.discard(session)

    @property
    def alive(self) -> bool:
        return self._session is not None and not self._session.closed

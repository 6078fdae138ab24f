"""Steering executed: the owner records a message's topics name are looked up (cluster/forward.py
`Forwarder`, the hosted tasks' records, the session's record), steer.py decides, and a replay or a
delivery goes to the owner through the forwarder. Without a forwarder (a single replica) every
message is served here."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..cluster.forward import Forwarder
from ..cluster.owners import Owner, OwnerGone, call_lost
from ..errors import ProxyError
from ..protocol import jsonrpc
from ..relay.tasks.host import LegacyTaskHost
from ..state.sessions import LegacySession
from .steer import LOCAL, Local, Replay, Topic, decide


class Steering:
    def __init__(self, forwarder: Forwarder | None, tasks: LegacyTaskHost | None) -> None:
        self._forwarder = forwarder
        self._tasks = tasks  # hosted tasks: a request about one goes where its call runs

    @property
    def forwarding(self) -> bool:
        """Whether another replica may own anything (a forwarder exists)."""
        return self._forwarder is not None

    async def decide(
        self,
        topics: tuple[Topic, ...],
        message: jsonrpc.JSONDict,
        principal: str,
        session: LegacySession | None = None,
    ) -> Local | Replay:
        """Where `message` (a legacy one in `session`) is served: its topics' owners looked up in
        order, until one is another replica."""
        if not topics or self._forwarder is None:
            return LOCAL
        owners: dict[Topic, Owner | None] = {}
        for topic in topics:
            owner = owners[topic] = await self._owner(topic, message, principal, session)
            if owner is not None:
                break
        return decide(topics, owners)

    async def _owner(
        self, topic: Topic, message: jsonrpc.JSONDict, principal: str, session: LegacySession | None
    ) -> Owner | None:
        """The other replica the record of `topic` names (None: this one, or nobody reachable)."""
        forwarder = self._forwarder
        assert forwarder is not None
        if topic is Topic.PARKED_CALL:
            return forwarder.state_owner(jsonrpc.params_of(message).get("requestState"), principal)
        if topic is Topic.TASK:
            return forwarder.stream_owner(await self._tasks.runner_of(principal, message)) if self._tasks else None
        assert session is not None, "a subscription or an answer belongs to a legacy session"
        if topic is Topic.SUBSCRIPTION:
            return forwarder.stream_owner(session.stream_owner)
        return forwarder.request_owner(message.get("id"), session.id)

    def stream_holder(self, holder: str | None) -> Owner | None:
        """The other replica a `boot@address` record names (a session's GET stream holder, the
        replica that took an input round over); None: this one, or nobody reachable."""
        if self._forwarder is None or not holder:
            return None
        return self._forwarder.stream_owner(holder)

    async def replay(
        self, request: web.Request, raw: bytes, decision: Replay, request_id: Any = None
    ) -> web.StreamResponse | None:
        """The request served at its owner, its reply copied back; None: the owner is gone and
        the request is served here (raises the call's loss when it cannot be)."""
        assert self._forwarder is not None
        try:
            return await self._forwarder.replay(request, raw, decision.owner, kind=decision.kind, request_id=request_id)
        except OwnerGone:
            if decision.local_if_gone:
                return None
            lost = call_lost()
            raise ProxyError(lost["code"], lost["message"], data=lost["data"]) from None

    async def deliver(self, request: web.Request, message: jsonrpc.JSONDict, decision: Replay) -> bool:
        """A message handed to its owner; False if the owner is gone."""
        assert self._forwarder is not None
        return await self._forwarder.deliver(request, message, decision.owner, kind=decision.kind)

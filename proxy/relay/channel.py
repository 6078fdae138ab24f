"""What a relay knows of the downstream request it serves: who is calling, and where the request's
interim messages go (notifications and server-to-client requests)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)  # not frozen: made for every request, and frozen fields cost a call each
class Caller:
    """The caller of one downstream request.

    `principal` names its authorization context (what sessions, pooled upstream sessions, private
    cache entries and requestState tokens are bound to); `credentials` go upstream with what the
    proxy sends for it (Authorization, trace context); `forwarded` are the headers a same-era
    request carries upstream unchanged (credentials, trace context, its own Mcp-* headers).
    """

    principal: str
    credentials: dict[str, str] = field(default_factory=dict)
    forwarded: dict[str, str] = field(default_factory=dict)


class ReplyChannel(Protocol):
    @property
    def can_stream(self) -> bool:
        """Whether interim messages can reach the client at all (it accepts SSE)."""

    @property
    def resumable(self) -> bool:
        """Whether an input round asked here is the request's own, which its client may resume on
        another replica (a hosted task's rounds are the task's)."""

    def exchange_bound_s(self, request_bound_s: float) -> float:
        """How long one upstream exchange of the call may take: a request's own bound, or as long
        as the task it runs for is kept."""

    async def send(self, message: dict[str, Any]) -> None:
        """Deliver one interim message before the final reply."""

    async def answered(self) -> None:
        """The client answered every input request of a round (a hosted task works again)."""


class RequestChannel:
    """What the channel of one downstream request answers: its call is the request's, bound by
    the request's timeout, and its input rounds are resumable."""

    __slots__ = ()
    resumable = True

    def exchange_bound_s(self, request_bound_s: float) -> float:
        return request_bound_s

    async def answered(self) -> None:
        return None


class _NoStream(RequestChannel):
    """A channel for a request that takes no interim messages (they go nowhere)."""

    __slots__ = ()
    can_stream = False

    async def send(self, message: dict[str, Any]) -> None:
        return None


NO_STREAM: ReplyChannel = _NoStream()

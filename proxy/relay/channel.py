"""What a relay knows of the downstream request it serves: who is calling, and where the request's
interim messages go (notifications and server-to-client requests)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True, slots=True)
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

    async def send(self, message: dict[str, Any]) -> None:
        """Deliver one interim message before the final reply."""


class _NoStream:
    """A channel for a request that takes no interim messages (they go nowhere)."""

    can_stream = False

    async def send(self, message: dict[str, Any]) -> None:
        return None


NO_STREAM: ReplyChannel = _NoStream()

"""Where a request's interim messages go: notifications and server-to-client requests."""

from __future__ import annotations

from typing import Any, Protocol


class ReplyChannel(Protocol):
    @property
    def can_stream(self) -> bool:
        """Whether interim messages can reach the client at all (it accepts SSE)."""

    async def send(self, message: dict[str, Any]) -> None:
        """Deliver one interim message before the final reply."""

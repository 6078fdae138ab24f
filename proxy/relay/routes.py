"""Who serves a message: the client's era, the upstream's era and the upstream's transport, as one
table built at start (docs/translation.md §0). The endpoint asks it for the upstream era it knows."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Protocol

from ..protocol.modern_validate import ModernRequest
from ..protocol.versions import Era
from .bytes import ByteRelay
from .channel import Caller, ReplyChannel
from .legacy_sessions import LegacySessionHost

JSONDict = dict[str, Any]


class ModernRelay(Protocol):
    """Serves modern clients' requests (translated for a legacy upstream, or message by message)."""

    async def handle(self, request: ModernRequest, channel: ReplyChannel, caller: Caller) -> tuple[JSONDict, int]:
        """The final reply to one request, and its HTTP status."""

    def listen(self, request: ModernRequest, caller: Caller) -> AsyncGenerator[JSONDict, None]:
        """A subscriptions/listen stream: its acknowledgement first; a ProxyError before it means
        the listen was refused; when the proxy ends it, its completion result last."""

    async def notify(self, message: JSONDict, caller: Caller) -> None:
        """Send on a client's notification of an extension; nothing answers it."""

    def end_streams(self) -> None:
        """Shutdown begins: end every listen stream gracefully."""


@dataclass(frozen=True, slots=True)
class Route:
    """How clients of each era are served for one upstream era."""

    # Legacy clients' sessions; None: the upstream's own sessions, relayed byte for byte.
    legacy: LegacySessionHost[Any] | None
    # Modern clients' requests; when `modern_bytes`, all but the cacheable ones and listens are
    # relayed byte for byte instead.
    modern: ModernRelay
    modern_bytes: bool


class Router:
    def __init__(self, routes: dict[Era, Route], byte_relay: ByteRelay | None) -> None:
        self._routes = routes
        self.byte_relay = byte_relay

    def __getitem__(self, upstream_era: Era) -> Route:
        return self._routes[upstream_era]


def routing_table(
    transport: str,
    *,
    translating: LegacySessionHost[Any],
    process_sessions: LegacySessionHost[Any] | None,
    same_era: ModernRelay,
    modern_to_legacy: ModernRelay,
    byte_relay: ByteRelay | None,
) -> Router:
    """The matrix, by upstream transport (docs/design.md §Routing):

    - modern upstream, http: legacy clients get sessions held here, translated; modern clients
      are relayed byte for byte (cacheable requests and listens message by message);
    - modern upstream, stdio: legacy clients as over http; modern clients message by message on
      the one shared server process;
    - legacy upstream, http: legacy clients byte for byte, in the upstream's own sessions;
      modern clients translated on pooled upstream sessions;
    - legacy upstream, stdio: legacy clients get sessions held here, a server process each;
      modern clients translated on pooled server processes;
    - legacy upstream, sse (2024-11-05 HTTP+SSE, legacy by definition): as legacy stdio, an SSE
      connection in place of each process.
    """
    table = {
        (Era.MODERN, "http"): Route(legacy=translating, modern=same_era, modern_bytes=True),
        (Era.MODERN, "stdio"): Route(legacy=translating, modern=same_era, modern_bytes=False),
        (Era.LEGACY, "http"): Route(legacy=None, modern=modern_to_legacy, modern_bytes=False),
        (Era.LEGACY, "stdio"): Route(legacy=process_sessions, modern=modern_to_legacy, modern_bytes=False),
        (Era.LEGACY, "sse"): Route(legacy=process_sessions, modern=modern_to_legacy, modern_bytes=False),
    }
    if transport == "http" and byte_relay is None:
        raise ValueError("an HTTP upstream needs the byte relay")
    if transport in ("stdio", "sse") and process_sessions is None:
        raise ValueError(f"a {transport} upstream needs its process sessions")
    return Router({era: route for (era, kind), route in table.items() if kind == transport}, byte_relay)

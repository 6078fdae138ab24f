"""What the relays need of an upstream, whatever its transport (Streamable HTTP or stdio)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

JSONDict = dict[str, Any]


class Reply(Protocol):
    """The reply to one message sent upstream: its messages as they arrive (then the reply ends)."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def __aiter__(self) -> AsyncIterator[JSONDict]: ...


class Upstream(Protocol):
    """An MCP server behind the proxy, one request at a time (HttpUpstream, StdioModernUpstream).

    Leaving `exchange` before its reply came is how the request is cancelled: over HTTP the stream
    closes, over stdio a notifications/cancelled goes out.
    """

    @property
    def name(self) -> str:
        """Its label in logs, metrics and messages (never its address)."""

    def exchange(self, message: JSONDict, headers: Mapping[str, str]) -> AbstractAsyncContextManager[Reply]:
        """Send `message` with `headers` (HTTP only) and yield the reply."""

    async def send(self, message: JSONDict, headers: Mapping[str, str]) -> None:
        """Send a notification (or a response) with `headers` (HTTP only): nothing answers it."""

"""The upstream edge, built from the `upstream` settings: the connection of its kind (Streamable
HTTP, a stdio server, an HTTP+SSE server), how legacy sessions are opened over it, and its shutdown.

What is built follows `UpstreamConfig.target`, the typed view of the kind (config.py), matched here
and nowhere else; the HTTP+SSE client (upstream/sse.py) is imported only for an HTTP+SSE server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import aiohttp

from ..config import HttpTarget, SseTarget, StdioTarget, UpstreamConfig, UpstreamTarget
from ..metrics import Metrics
from .http import HttpUpstream
from .legacy_session import SessionFactory, http_sessions, stdio_sessions
from .stdio import ProbeHandover, StdioModernUpstream, StdioProcess, process_factory

if TYPE_CHECKING:
    from .sse import SseConnector


@dataclass(frozen=True)
class Processes:
    """Legacy client sessions that are each a server process (stdio) or an SSE connection (HTTP+SSE):
    how one is started, how many may live at once, how long one may stay idle."""

    make: Callable[..., StdioProcess]
    max_live: int
    idle_s: float


@dataclass(frozen=True)
class UpstreamEdge:
    target: UpstreamTarget
    modern: HttpUpstream | StdioModernUpstream  # what serves modern requests (a modern upstream)
    legacy_sessions: SessionFactory  # the sessions pooled for modern clients of a legacy upstream
    http: HttpUpstream | None = None
    # stdio and HTTP+SSE: the shared channel (modern service, stdio only) and the sessions held here
    stdio: StdioModernUpstream | None = None
    processes: Processes | None = None
    sse: SseConnector | None = None
    owns_client: bool = True  # the HTTP client session is the edge's own, closed with it
    handover: ProbeHandover | None = None  # stdio: the era probe's process, for its first user

    async def close(self) -> None:
        if self.handover is not None:
            await self.handover.close()
        if self.stdio is not None:
            await self.stdio.close()
        if self.http is not None and self.owns_client:
            await self.http.close()
        if self.sse is not None and self.owns_client:
            await self.sse.close()


def build_upstream(
    config: UpstreamConfig, metrics: Metrics, client_session: aiohttp.ClientSession | None = None
) -> UpstreamEdge:
    """The edge for `config`; `client_session`: the caller's HTTP client (then not closed here)."""
    owns_client = client_session is None
    target = config.target
    match target:
        case HttpTarget():
            http = HttpUpstream(config, client_session or HttpUpstream.client_session(config))
            sessions = http_sessions(http, config.initialize_timeout_s)
            return UpstreamEdge(target, http, sessions, http=http, owns_client=owns_client)
        case SseTarget(url=url, connections=connections):
            from .sse import SseConnector

            sse = SseConnector(
                url,
                config.name,
                client_session or SseConnector.client_session(config.connect_timeout_s),
                static_headers=config.headers,
                connect_timeout_s=config.connect_timeout_s,
                endpoint_timeout_s=connections.endpoint_timeout_s,
                max_event_bytes=config.max_reply_bytes,
                max_sessions=connections.max_sessions,
                tally=metrics.upstream_sse_sessions.labels(config.name),
            )
            # Its connections have the StdioProcess interface (start, write, running, exited, stop).
            make = cast("Callable[..., StdioProcess]", sse)
            processes = Processes(make, connections.max_sessions, connections.session_idle_s)
            return _held_sessions(config, target, processes, sse=sse, owns_client=owns_client)
        case StdioTarget(command=command, env=env, cwd=cwd, processes=bounds):
            tally = metrics.upstream_processes.labels(config.name)
            make = process_factory(command, config.name, env, cwd, tally)
            processes = Processes(make, bounds.max_processes, bounds.process_idle_s)
            return _held_sessions(config, target, processes, owns_client=owns_client)


def _held_sessions(
    config: UpstreamConfig,
    target: UpstreamTarget,
    processes: Processes,
    *,
    sse: SseConnector | None = None,
    owns_client: bool,
) -> UpstreamEdge:
    """A stdio or HTTP+SSE upstream: an HTTP+SSE server is never asked for modern service (its era
    is legacy, not probed), so the shared channel exists for the stdio case only."""
    # An HTTP+SSE server's era is not probed: nothing to hand over.
    handover = ProbeHandover(config.name, config.shutdown_grace_s) if sse is None else None
    stdio = StdioModernUpstream(
        config.name,
        processes.make,
        grace_s=config.shutdown_grace_s,
        backoff_max_s=config.restart_backoff_max_s,
        handover=handover,
    )
    sessions = stdio_sessions(
        processes.make, config.name, config.shutdown_grace_s, config.initialize_timeout_s, handover
    )
    return UpstreamEdge(
        target, stdio, sessions, stdio=stdio, processes=processes, sse=sse, owns_client=owns_client, handover=handover
    )

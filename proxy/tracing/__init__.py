"""Spans for each downstream request and each upstream exchange, behind a small interface.

The proxy calls only what is here. With `tracing.otlp_endpoint` unset this module is all there
is: nothing from opentelemetry is imported, and every call returns one of the module-level null
spans below, so a request allocates nothing for tracing. With an endpoint, proxy/tracing/otel.py
(the `[otel]` extra) implements the same interface on an OpenTelemetry SDK TracerProvider of its
own (never the process's global one: an embedding application or a test keeps its own).

The downstream span of the request being served is found through a context variable: the upstream
edges (upstream/http.py, upstream/stdio.py, relay/bytes.py) ask `upstream()` for their span without
being handed a tracer, and a task the request starts inherits it. A task that outlives the request
(an upstream GET stream, a shared listen) is started in `background()`, so it parents on nothing.
"""

from __future__ import annotations

import contextvars
import importlib.util
from collections.abc import Mapping
from typing import Any

from ..config import ConfigError, TracingConfig

JSONDict = dict[str, Any]


class UpstreamSpan:
    """One upstream exchange (a CLIENT span). This class is the no-op one: `NULL_UPSTREAM`, shared
    by every exchange while tracing is off or no request is being served."""

    __slots__ = ()

    def headers(self, headers: Mapping[str, str]) -> Mapping[str, str]:
        """The request's headers, with the trace context that makes this span the upstream's parent."""
        return headers

    def message(self, message: JSONDict | None) -> JSONDict | None:
        """The request, its `_meta` trace context this span's (only requests; others as they are)."""
        return message

    def status(self, status: int) -> None:
        """The upstream's HTTP status."""

    def end(self, exc: BaseException | None = None) -> None:
        """The exchange is over (`exc`: how it failed)."""


class DownstreamSpan:
    """One downstream request (a SERVER span). This class is the no-op one: `NULL_DOWNSTREAM`."""

    __slots__ = ()

    def begin(self, body: object) -> None:
        """The request's body is read (None: it has none): the span starts, parented on the trace
        context of the body's `_meta` or else of the headers, and is the current request's."""

    def input_round(self) -> None:
        """The upstream asked the client for input once more (each round is an upstream exchange)."""

    def finish(
        self,
        method: object,
        downstream_era: str,
        upstream_era: str,
        outcome: str,
        status: int,
        error_code: object = None,
    ) -> None:
        """The reply is sent (for a stream: the stream ended); the span ends."""

    def upstream(
        self, message: JSONDict | None, transport: str, http_method: str, name: str | None = None
    ) -> UpstreamSpan:
        return NULL_UPSTREAM


NULL_UPSTREAM = UpstreamSpan()
NULL_DOWNSTREAM = DownstreamSpan()


class Tracing:
    """No spans: what the proxy runs with when `tracing.otlp_endpoint` is unset."""

    enabled = False

    def downstream(self, http_method: str, headers: Mapping[str, str]) -> DownstreamSpan:
        """The span of one downstream HTTP request, not begun yet (its body may name the parent)."""
        return NULL_DOWNSTREAM

    async def shutdown(self) -> None:
        """Export what is left (at proxy shutdown)."""


NO_TRACING = Tracing()

# The downstream span of the request this task serves (set by DownstreamSpan.begin while on).
CURRENT: contextvars.ContextVar[DownstreamSpan | None] = contextvars.ContextVar("mcp_era_proxy_span", default=None)


def upstream(
    message: JSONDict | None, transport: str, http_method: str = "POST", name: str | None = None
) -> UpstreamSpan:
    """The span of one upstream exchange (`name`: its span name when it is not `message`'s), a child
    of the request being served, if any."""
    span = CURRENT.get()
    return NULL_UPSTREAM if span is None else span.upstream(message, transport, http_method, name)


def input_round() -> None:
    span = CURRENT.get()
    if span is not None:
        span.input_round()


def background() -> contextvars.Context | None:
    """The context for a task that outlives the request that starts it (asyncio.create_task's
    `context`): the request's span is not its parent. None (the task's usual copy) while off."""
    if CURRENT.get() is None:
        return None
    context = contextvars.copy_context()
    context.run(CURRENT.set, None)
    return context


# What tracing/otel.py imports: the `[otel]` extra.
_OTEL_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter")


def require(config: TracingConfig) -> None:
    """Refuse (ConfigError: exit 2, like any bad setting) an endpoint without the `[otel]` extra,
    before the proxy starts rather than at its first request."""
    if config.otlp_endpoint is None:
        return
    for name in _OTEL_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            raise ConfigError(
                f"tracing.otlp_endpoint is set but {name} is not installed: pip install 'mcp-era-proxy[otel]'"
            )

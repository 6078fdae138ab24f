"""proxy/tracing/__init__.py's interface on the OpenTelemetry SDK (the `[otel]` extra); imported only when
`tracing.otlp_endpoint` is set, or by a test or an embedding application handing in its own provider.

Spans follow the OpenTelemetry MCP semantic conventions: named `{mcp.method.name} {target}` (the
tool or prompt name), with mcp.method.name, jsonrpc.request.id, mcp.protocol.version,
gen_ai.tool.name / gen_ai.prompt.name / mcp.resource.uri, error.type; the proxy adds its own
(mcp_era_proxy.*). W3C trace context is read from the request's `_meta` (where the conventions put
it) or else its headers, and written into both on the way upstream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import structlog
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import __version__, tracing
from ..config import TracingConfig
from ..metrics import method_label
from ..protocol import meta

log = structlog.get_logger(__name__)
JSONDict = dict[str, Any]
AttrValue = str | bool | int | float
_PROPAGATOR = TraceContextTextMapPropagator()
_TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
_ERROR_OUTCOMES = frozenset({"error", "rejected", "upstream_error", "shutdown"})
_MAX_ATTRIBUTE = 200  # characters kept of a client-chosen name (a method, a tool, a URI)


class OtelTracing(tracing.Tracing):
    """Spans on `provider`; `owned`: the proxy built it and shuts it down (flushing) at shutdown."""

    enabled = True

    def __init__(self, provider: TracerProvider, *, owned: bool = False) -> None:
        self._provider = provider
        self._owned = owned
        self._tracer = provider.get_tracer("mcp-era-proxy", __version__)

    @classmethod
    def exporting(cls, config: TracingConfig, exporter: SpanExporter | None = None) -> OtelTracing:
        """Batched OTLP/HTTP export to `config.otlp_endpoint` (or to `exporter`); new traces sampled
        at `sample_ratio`, an incoming trace's decision followed (ParentBased)."""
        assert config.otlp_endpoint is not None or exporter is not None
        provider = TracerProvider(
            # Resource() rather than Resource.create(): the latter runs the SDK's resource detectors
            # on a thread pool and waits for them, blocking the event loop the app is built on.
            resource=Resource({"service.name": config.service_name, "service.version": __version__}),
            sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
        )
        if exporter is None:
            exporter = OTLPSpanExporter(endpoint=config.otlp_endpoint, headers=dict(config.headers) or None)
        provider.add_span_processor(BatchSpanProcessor(exporter))
        _sdk_logs_as_events()
        log.info(
            "tracing_enabled",
            endpoint=config.otlp_endpoint,
            service_name=config.service_name,
            sample_ratio=config.sample_ratio,
        )
        return cls(provider, owned=True)

    def downstream(self, http_method: str, headers: Mapping[str, str]) -> tracing.DownstreamSpan:
        return _Downstream(self._tracer, http_method, headers)

    async def shutdown(self) -> None:
        if self._owned:
            # Flushes the batch (an HTTP export, blocking): off the event loop.
            await asyncio.to_thread(self._provider.shutdown)


class _SdkLogs(logging.Handler):
    """The SDK's own warnings (a batch the endpoint refused or could not take, spans dropped from a
    full queue) as the proxy's JSON log events, not stray plain-text lines on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        log.warning("tracing_export_problem", logger=record.name, message=record.getMessage()[:500])


def _sdk_logs_as_events() -> None:
    sdk = logging.getLogger("opentelemetry")
    if not any(isinstance(handler, _SdkLogs) for handler in sdk.handlers):
        sdk.addHandler(_SdkLogs(logging.WARNING))
        sdk.propagate = False


def _carrier(source: Mapping[str, Any] | None) -> dict[str, str]:
    """The W3C trace keys of `source` that are strings (a client's `_meta` may hold anything)."""
    if not source:
        return {}
    return {key: value for key in _TRACE_HEADERS if isinstance(value := source.get(key), str)}


def _parent(body: object, headers: Mapping[str, str]) -> Context:
    """The request's `_meta` trace context if it carries one (the MCP conventions' carrier, and a
    2026-07-28 client's), else its headers'."""
    carrier = _carrier(meta.meta_of(body.get("params")) if isinstance(body, dict) else None)
    if "traceparent" not in carrier:
        carrier = _carrier(headers)
    return _PROPAGATOR.extract(carrier)


def _describe(message: object) -> tuple[str, dict[str, AttrValue]]:
    """The span name and the MCP attributes of one JSON-RPC message."""
    if isinstance(message, list):
        return "batch", {"mcp.method.name": "batch"}
    if not isinstance(message, dict):
        return "", {}
    method = message.get("method")
    attributes: dict[str, AttrValue] = {}
    if "id" in message and isinstance(message["id"], str | int) and not isinstance(message["id"], bool):
        attributes["jsonrpc.request.id"] = str(message["id"])[:_MAX_ATTRIBUTE]
    if not isinstance(method, str):
        return "response", attributes  # a client's answer to a request the server sent
    attributes["mcp.method.name"] = method[:_MAX_ATTRIBUTE]
    params = message.get("params")
    params = params if isinstance(params, dict) else {}
    request_meta = meta.meta_of(params) or {}
    version = request_meta.get(meta.PROTOCOL_VERSION)
    if isinstance(version, str):
        attributes["mcp.protocol.version"] = version[:_MAX_ATTRIBUTE]
    name = params.get("name")
    target = name[:_MAX_ATTRIBUTE] if isinstance(name, str) and method in ("tools/call", "prompts/get") else None
    if method == "tools/call":
        attributes["gen_ai.operation.name"] = "execute_tool"
        if target is not None:
            attributes["gen_ai.tool.name"] = target
    elif method == "prompts/get" and target is not None:
        attributes["gen_ai.prompt.name"] = target
    elif method == "resources/read" and isinstance(params.get("uri"), str):
        attributes["mcp.resource.uri"] = params["uri"][:_MAX_ATTRIBUTE]
    label = method_label(method)  # span names stay few: a client's made-up method is "other"
    return (f"{label} {target}" if target is not None and label != "other" else label), attributes


class _Downstream(tracing.DownstreamSpan):
    __slots__ = ("_ended", "_headers", "_http_method", "_rounds", "_span", "_started", "_token", "_tracer")

    def __init__(self, tracer: Tracer, http_method: str, headers: Mapping[str, str]) -> None:
        self._tracer = tracer
        self._http_method = http_method
        self._headers = headers
        self._started = time.time_ns()  # the span starts once the body is read, dated from here
        self._span: Span | None = None
        self._token: Any = None
        self._rounds = 0
        self._ended = False

    def begin(self, body: object) -> None:
        if self._span is not None:
            return
        name, attributes = _describe(body)
        if body is None:
            name = self._http_method  # a GET or DELETE on the session
        attributes["http.request.method"] = self._http_method
        version = self._headers.get("MCP-Protocol-Version")
        if isinstance(version, str) and "mcp.protocol.version" not in attributes:
            attributes["mcp.protocol.version"] = version[:_MAX_ATTRIBUTE]
        self._span = self._tracer.start_span(
            name or self._http_method,
            context=_parent(body, self._headers),
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=self._started,
        )
        self._token = tracing.CURRENT.set(self)

    def input_round(self) -> None:
        self._rounds += 1

    def finish(
        self,
        method: object,
        downstream_era: str,
        upstream_era: str,
        outcome: str,
        status: int,
        error_code: object = None,
    ) -> None:
        if self._ended:
            return
        if self._span is None:
            self.begin(None if method is None else {"method": method})  # refused before its body was read
        span = self._span
        assert span is not None
        self._ended = True
        if self._token is not None:
            tracing.CURRENT.reset(self._token)
            self._token = None
        span.set_attributes(
            {
                "mcp_era_proxy.downstream_era": downstream_era,
                "mcp_era_proxy.upstream_era": upstream_era,
                "mcp_era_proxy.outcome": outcome,
                "mcp_era_proxy.input_rounds": self._rounds,
                "http.response.status_code": status,
            }
        )
        if outcome in _ERROR_OUTCOMES:
            code = str(error_code) if isinstance(error_code, int) and not isinstance(error_code, bool) else None
            span.set_attribute("error.type", code or outcome)
            if code is not None:
                span.set_attribute("rpc.response.status_code", code)
            span.set_status(StatusCode.ERROR, outcome)
        span.end()

    def upstream(
        self, message: JSONDict | None, transport: str, http_method: str, name: str | None = None
    ) -> tracing.UpstreamSpan:
        if self._ended or self._span is None:
            return tracing.NULL_UPSTREAM  # a task that outlived its request: it parents on nothing
        described, attributes = _describe(message)
        name = name or described
        attributes["network.transport"] = "pipe" if transport == "stdio" else "tcp"
        if transport != "stdio":
            attributes["http.request.method"] = http_method
        attributes["mcp_era_proxy.round"] = self._rounds
        span = self._tracer.start_span(
            name or http_method,
            context=set_span_in_context(self._span),
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        return _Upstream(span)


class _Upstream(tracing.UpstreamSpan):
    __slots__ = ("_context", "_span")

    def __init__(self, span: Span) -> None:
        self._span = span
        self._context: dict[str, str] = {}
        _PROPAGATOR.inject(self._context, context=set_span_in_context(span))

    def headers(self, headers: Mapping[str, str]) -> Mapping[str, str]:
        kept = {name: value for name, value in headers.items() if name.lower() not in _TRACE_HEADERS}
        return {**kept, **self._context}

    def message(self, message: JSONDict | None) -> JSONDict | None:
        if message is None or "id" not in message or not isinstance(message.get("method"), str):
            return message  # only requests carry trace context
        params = message.get("params")
        base = params if isinstance(params, dict) else {}
        request_meta = {k: v for k, v in (meta.meta_of(base) or {}).items() if k not in _TRACE_HEADERS}
        return {**message, "params": {**base, "_meta": {**request_meta, **self._context}}}

    def status(self, status: int) -> None:
        self._span.set_attribute("http.response.status_code", status)
        if status >= 400:
            self._span.set_attribute("error.type", str(status))
            self._span.set_status(StatusCode.ERROR)

    def end(self, exc: BaseException | None = None) -> None:
        if exc is not None and not isinstance(exc, asyncio.CancelledError | GeneratorExit):
            self._span.set_attribute("error.type", exc.__class__.__name__)
            self._span.set_status(StatusCode.ERROR, str(exc)[:_MAX_ATTRIBUTE])
        self._span.end()

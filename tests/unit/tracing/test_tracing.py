"""proxy/tracing/__init__.py's interface: the null spans while off, and the OpenTelemetry implementation's
sampling, propagation and parenting rules."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator
from unittest import mock

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind

from proxy import tracing
from proxy.app import tracing_from_settings
from proxy.config import ConfigError, TracingConfig
from proxy.protocol import meta
from proxy.tracing.otel import OtelTracing

TRACE, SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
SAMPLED = f"00-{TRACE}-{SPAN}-01"
NOT_SAMPLED = f"00-{TRACE}-{SPAN}-00"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.shutdown()


@pytest.fixture
def traced(exporter: InMemorySpanExporter) -> Iterator[OtelTracing]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield OtelTracing(provider)
    provider.shutdown()


def request(method: str = "tools/call", **params: object) -> dict[str, object]:
    return {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}


# ---------------------------------------------------------------------------- off


def test_without_an_endpoint_the_proxy_gets_the_null_tracing_and_its_shared_null_spans() -> None:
    off = tracing_from_settings(TracingConfig())
    assert off is tracing.NO_TRACING and not off.enabled
    span = off.downstream("POST", {"traceparent": SAMPLED})
    assert span is tracing.NULL_DOWNSTREAM
    span.begin(request())
    assert tracing.CURRENT.get() is None  # nothing set: the upstream edges find no span
    assert tracing.upstream(request(), "http") is tracing.NULL_UPSTREAM
    assert tracing.background() is None  # asyncio.create_task's own copy of the context
    headers = {"traceparent": SAMPLED}
    message = request()
    assert tracing.NULL_UPSTREAM.headers(headers) is headers
    assert tracing.NULL_UPSTREAM.message(message) is message


# ---------------------------------------------------------------------------- on


def test_an_endpoint_builds_a_provider_of_its_own_sampling_parent_based_on_the_ratio_exporting_otlp() -> None:
    config = TracingConfig(
        otlp_endpoint="http://127.0.0.1:4318/v1/traces", service_name="edge", sample_ratio=0.25, headers={"A": "b"}
    )
    # The exporter as the proxy makes it (the SDK keeps it in private fields that differ by version).
    with mock.patch("proxy.tracing.otel.OTLPSpanExporter", wraps=OTLPSpanExporter) as made:
        on = tracing_from_settings(config)
    assert isinstance(on, OtelTracing) and on.enabled
    made.assert_called_once_with(endpoint="http://127.0.0.1:4318/v1/traces", headers={"A": "b"})
    provider = on._provider
    assert provider.resource.attributes["service.name"] == "edge"
    sampler = provider.sampler
    assert isinstance(sampler, ParentBased)
    assert isinstance(sampler._root, TraceIdRatioBased) and sampler._root.rate == 0.25
    (processor,) = provider._active_span_processor._span_processors
    assert isinstance(processor, BatchSpanProcessor)
    assert trace.get_tracer_provider() is not provider  # never the process's global provider
    provider.shutdown()


async def test_a_ratio_of_zero_samples_no_new_trace_but_follows_a_sampled_incoming_one(
    exporter: InMemorySpanExporter,
) -> None:
    config = TracingConfig(otlp_endpoint="http://127.0.0.1:9/v1/traces", sample_ratio=0.0)
    on = OtelTracing.exporting(config, exporter)
    for headers in ({}, {"traceparent": NOT_SAMPLED}, {"traceparent": SAMPLED}):
        span = on.downstream("POST", headers)
        span.begin(request("tools/list"))
        span.finish("tools/list", "legacy", "modern", "ok", 200)
    await on.shutdown()  # flushes the batch
    (only,) = exporter.get_finished_spans()
    assert only.parent is not None and format(only.parent.span_id, "016x") == SPAN


def test_the_request_meta_traceparent_wins_over_the_header_and_a_non_string_one_is_ignored(
    traced: OtelTracing, exporter: InMemorySpanExporter
) -> None:
    other_trace, other_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    from_meta = request(_meta={"traceparent": f"00-{other_trace}-{other_span}-01"})
    hostile = request(_meta={"traceparent": 12345, "tracestate": ["x"]})
    for body in (from_meta, hostile):
        span = traced.downstream("POST", {"traceparent": SAMPLED})
        span.begin(body)
        span.finish("tools/call", "modern", "modern", "ok", 200)
    first, second = exporter.get_finished_spans()
    assert first.parent is not None and format(first.parent.span_id, "016x") == other_span
    assert second.parent is not None and format(second.parent.span_id, "016x") == SPAN


def test_an_upstream_span_rewrites_the_trace_context_of_headers_and_meta_and_keeps_the_rest(
    traced: OtelTracing, exporter: InMemorySpanExporter
) -> None:
    downstream = traced.downstream("POST", {"traceparent": SAMPLED, "tracestate": "k=v"})
    downstream.begin(request("tools/call", name="deploy"))
    try:
        upstream = tracing.upstream(
            request(
                "tools/call", name="deploy", _meta={"traceparent": SAMPLED, "baggage": "b=1", meta.LOG_LEVEL: "info"}
            ),
            "http",
        )
        assert upstream is not tracing.NULL_UPSTREAM
        headers = upstream.headers({"TraceParent": SAMPLED, "Authorization": "Bearer t"})
        outgoing = upstream.message(
            request(
                "tools/call", name="deploy", _meta={"traceparent": SAMPLED, "baggage": "b=1", meta.LOG_LEVEL: "info"}
            )
        )
        note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}
        assert upstream.message(note) is note  # only requests carry it
        upstream.end()
    finally:
        downstream.finish("tools/call", "legacy", "modern", "ok", 200)
    client = next(s for s in exporter.get_finished_spans() if s.kind is SpanKind.CLIENT)
    context = client.get_span_context()
    mine = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    assert headers == {"Authorization": "Bearer t", "traceparent": mine, "tracestate": "k=v"}
    assert outgoing is not None
    assert outgoing["params"]["_meta"] == {
        "traceparent": mine,
        "tracestate": "k=v",  # the incoming trace's state, carried on
        "baggage": "b=1",
        meta.LOG_LEVEL: "info",
    }
    assert outgoing["params"]["name"] == "deploy"


async def test_a_task_started_in_background_or_after_the_request_ended_parents_on_nothing(
    traced: OtelTracing, exporter: InMemorySpanExporter
) -> None:
    downstream = traced.downstream("POST", {"traceparent": SAMPLED})
    downstream.begin(request("tools/list"))

    async def exchange() -> tracing.UpstreamSpan:
        return tracing.upstream(request("tools/list"), "http")

    inherited = await asyncio.create_task(exchange())
    assert inherited is not tracing.NULL_UPSTREAM
    inherited.end()
    detached = await asyncio.create_task(exchange(), context=tracing.background())
    assert detached is tracing.NULL_UPSTREAM
    started = asyncio.Event()
    resume = asyncio.Event()

    async def outlives() -> tracing.UpstreamSpan:
        started.set()
        await resume.wait()
        return tracing.upstream(request("tools/list"), "http")

    late = asyncio.create_task(outlives())
    await started.wait()
    downstream.finish("tools/list", "legacy", "modern", "ok", 200)
    assert tracing.CURRENT.get() is None  # reset with the request
    resume.set()
    assert await late is tracing.NULL_UPSTREAM
    assert len(exporter.get_finished_spans()) == 2  # the request's and its one child's


def test_a_failed_exchange_records_the_failure_and_an_http_error_status(
    traced: OtelTracing, exporter: InMemorySpanExporter
) -> None:
    downstream = traced.downstream("POST", {})
    downstream.begin(request("tools/list"))
    refused = tracing.upstream(request("tools/list"), "http")
    refused.status(503)
    refused.end()
    broken = tracing.upstream(request("tools/list"), "stdio")
    broken.end(ConnectionResetError("pipe closed"))
    downstream.finish("tools/list", "legacy", "modern", "upstream_error", 200, -32010)
    spans = {(s.kind, (s.attributes or {}).get("network.transport")): s for s in exporter.get_finished_spans()}
    assert (spans[(SpanKind.CLIENT, "tcp")].attributes or {})["error.type"] == "503"
    assert (spans[(SpanKind.CLIENT, "pipe")].attributes or {})["error.type"] == "ConnectionResetError"
    server = spans[(SpanKind.SERVER, None)]
    assert (server.attributes or {})["error.type"] == "-32010"


def test_span_names_stay_few_a_made_up_method_is_other(traced: OtelTracing, exporter: InMemorySpanExporter) -> None:
    for body in (request("x/" + "y" * 500, name="t"), request("prompts/get", name="greet"), [request()]):
        span = traced.downstream("POST", {})
        span.begin(body)
        span.finish(None, "legacy", "modern", "ok", 200)
    names = [s.name for s in exporter.get_finished_spans()]
    assert names == ["other", "prompts/get greet", "batch"]
    made_up = exporter.get_finished_spans()[0]
    assert len(str((made_up.attributes or {})["mcp.method.name"])) == 200


def test_an_endpoint_without_the_otel_extra_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def without_exporter(name: str, package: str | None = None) -> object:
        if name.startswith("opentelemetry.exporter"):
            raise ModuleNotFoundError(name)
        return real(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", without_exporter)
    tracing.require(TracingConfig())  # off: nothing is looked for
    with pytest.raises(ConfigError, match=r"tracing.otlp_endpoint is set but .* pip install 'mcp-era-proxy\[otel\]'"):
        tracing.require(TracingConfig(otlp_endpoint="http://127.0.0.1:4318/v1/traces"))

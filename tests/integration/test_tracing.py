"""Spans through a running proxy, read from the SDK's in-memory exporter: one SERVER span per
downstream request parented on the client's trace context, one CLIENT span per upstream exchange
as its child, and that exchange's context is what the upstream receives."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from structlog.testing import capture_logs

from proxy.app import create_app
from proxy.config import load_settings
from proxy.protocol.jsonrpc import INTERNAL_ERROR
from proxy.tracing.otel import OtelTracing
from tests.integration.conftest import UPSTREAM_NAME, Proxy, closed_port_url, serve
from tests.support.fake_modern import Call, FakeModern, Outcome, complete, error, input_required
from tests.support.legacy_client import LegacyClient, initialize_message
from tests.support.mcp_client import ACCEPT, SseReader
from tests.support.modern_client import ModernClient
from tests.support.sse_server import FakeSseServer

JSONDict = dict[str, Any]
WAIT = 5.0
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
ELICIT = {
    "method": "elicitation/create",
    "params": {
        "mode": "form",
        "message": "Deploy to production?",
        "requestedSchema": {"type": "object", "properties": {"confirm": {"type": "boolean"}}, "required": ["confirm"]},
    },
}


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.shutdown()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()  # the SDK's defaults: every span sampled
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


@pytest.fixture
async def traced(aiohttp_server: Any, aiohttp_client: Any, fake: FakeModern, provider: TracerProvider) -> Proxy:
    """The proxy in front of the fake modern upstream, its spans on the test's provider."""
    return await _proxy(aiohttp_server, aiohttp_client, provider, fake.url)


async def _proxy(aiohttp_server: Any, aiohttp_client: Any, provider: TracerProvider, url: str, **extra: Any) -> Proxy:
    settings = load_settings(
        None,
        **{"upstream.url": url, "upstream.name": UPSTREAM_NAME, "upstream.era": "modern", "cache.watch": False} | extra,
    )
    app, _ = create_app(settings, tracing=OtelTracing(provider))
    client = await aiohttp_client(await serve(aiohttp_server, app))
    return Proxy(app, client, settings)


def hexes(span: ReadableSpan) -> tuple[str, str]:
    context = span.get_span_context()
    assert context is not None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def parent_of(span: ReadableSpan) -> str | None:
    return format(span.parent.span_id, "016x") if span.parent is not None else None


def traceparent_of(span: ReadableSpan) -> str:
    trace_id, span_id = hexes(span)
    context = span.get_span_context()
    assert context is not None
    return f"00-{trace_id}-{span_id}-{context.trace_flags:02x}"


def only(spans: list[ReadableSpan]) -> ReadableSpan:
    assert len(spans) == 1, [s.name for s in spans]
    return spans[0]


def of_kind(exporter: InMemorySpanExporter, kind: SpanKind, name: str | None = None) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind is kind and (name is None or s.name == name)]


async def test_a_legacy_clients_call_with_an_input_round_is_one_trace_one_upstream_span_per_round(
    traced: Proxy, fake: FakeModern, exporter: InMemorySpanExporter
) -> None:
    rounds = iter([input_required({"confirm": ELICIT}, "state-1"), complete(content=[{"type": "text", "text": "ok"}])])

    async def deploy(call: Call) -> Outcome:
        return next(rounds)

    fake.handlers["tools/call"] = deploy
    peer = await LegacyClient.connect(traced.client, headers={"traceparent": TRACEPARENT})
    exporter.clear()  # the initialize: its own span, checked elsewhere
    async with asyncio.timeout(WAIT):
        request_id, response = await peer.send("tools/call", {"name": "deploy", "arguments": {}})
        reader = SseReader(response)
        asked = await reader.message()
        assert asked is not None and asked["method"] == "elicitation/create"
        assert await peer.respond(asked["id"], {"action": "accept", "content": {"confirm": True}}) == 202
        final = await reader.message()
        assert final is not None and final["id"] == request_id and "result" in final
        assert await reader.message() is None
    downstream = only(of_kind(exporter, SpanKind.SERVER, "tools/call deploy"))
    trace_id, downstream_id = hexes(downstream)
    assert trace_id == CLIENT_TRACE and parent_of(downstream) == CLIENT_SPAN
    attributes = downstream.attributes or {}
    assert attributes["mcp.method.name"] == "tools/call"
    assert attributes["gen_ai.tool.name"] == "deploy"
    assert attributes["jsonrpc.request.id"] == str(request_id)
    assert attributes["mcp_era_proxy.downstream_era"] == "legacy"
    assert attributes["mcp_era_proxy.upstream_era"] == "modern"
    assert attributes["mcp_era_proxy.outcome"] == "ok"
    assert attributes["mcp_era_proxy.input_rounds"] == 1
    assert downstream.status.status_code is StatusCode.UNSET
    # The tool's headers are learnt first (a tools/list of the call's own), then one call per round.
    prefetch = only(of_kind(exporter, SpanKind.CLIENT, "tools/list"))
    assert parent_of(prefetch) == downstream_id
    upstream = sorted(of_kind(exporter, SpanKind.CLIENT, "tools/call deploy"), key=lambda s: s.start_time or 0)
    assert len(upstream) == 2
    assert [(s.attributes or {})["mcp_era_proxy.round"] for s in upstream] == [0, 1]
    for span in upstream:
        assert hexes(span)[0] == CLIENT_TRACE and parent_of(span) == downstream_id
        assert (span.attributes or {})["http.response.status_code"] == 200
    # Each upstream request carried its own span's context, in its headers and its `_meta`: the
    # upstream's spans become children of the proxy's exchange, not of the client's span.
    calls = fake.calls_of("tools/call")
    assert [c.headers["traceparent"] for c in calls] == [traceparent_of(s) for s in upstream]
    assert [c.meta["traceparent"] for c in calls] == [traceparent_of(s) for s in upstream]
    # The client's answer was a request of its own: a span in the same trace, beside the call's.
    answer = only(of_kind(exporter, SpanKind.SERVER, "response"))
    assert hexes(answer)[0] == CLIENT_TRACE and parent_of(answer) == CLIENT_SPAN


async def test_a_modern_request_parents_on_its_meta_traceparent_before_its_headers(
    traced: Proxy, fake: FakeModern, exporter: InMemorySpanExporter
) -> None:
    meta_trace, meta_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    fake.handlers["tools/call"] = lambda call: _complete()
    peer = ModernClient(traced.client, headers={"traceparent": TRACEPARENT})
    params = {
        "name": "echo",
        "arguments": {"k": [1, {"deep": None}]},
        "x-unknown": True,
        "_meta": {"traceparent": f"00-{meta_trace}-{meta_span}-01", "io.example/keep": "yes"},
    }
    reply = await peer.request("tools/call", params)
    assert reply.status == 200
    downstream = only(of_kind(exporter, SpanKind.SERVER))
    assert hexes(downstream)[0] == meta_trace and parent_of(downstream) == meta_span
    assert (downstream.attributes or {})["mcp_era_proxy.downstream_era"] == "modern"
    assert (downstream.attributes or {})["mcp.protocol.version"] == "2026-07-28"
    upstream = only(of_kind(exporter, SpanKind.CLIENT))
    assert parent_of(upstream) == hexes(downstream)[1]
    # Relayed as it came but for its trace context: headers and `_meta` name the exchange's span.
    (call,) = fake.calls_of("tools/call")
    assert call.headers["traceparent"] == traceparent_of(upstream)
    assert call.meta["traceparent"] == traceparent_of(upstream)
    assert call.meta["io.example/keep"] == "yes"
    assert call.params["arguments"] == {"k": [1, {"deep": None}]} and call.params["x-unknown"] is True


async def _complete() -> Outcome:
    return complete(content=[{"type": "text", "text": "ok"}])


async def test_a_request_without_trace_context_starts_a_trace_the_upstream_joins(
    traced: Proxy, fake: FakeModern, exporter: InMemorySpanExporter
) -> None:
    peer = await LegacyClient.connect(traced.client)
    reply = await peer.request("tools/list")
    assert reply.status == 200
    downstream = only(of_kind(exporter, SpanKind.SERVER, "tools/list"))
    assert downstream.parent is None
    upstream = only(of_kind(exporter, SpanKind.CLIENT, "tools/list"))
    assert parent_of(upstream) == hexes(downstream)[1]
    (call,) = fake.calls_of("tools/list")
    assert call.headers["traceparent"] == call.meta["traceparent"] == traceparent_of(upstream)


async def test_an_upstream_error_reply_marks_the_downstream_span_with_its_code(
    traced: Proxy, fake: FakeModern, exporter: InMemorySpanExporter
) -> None:
    fake.handlers["tools/call"] = lambda call: _failing()
    peer = await LegacyClient.connect(traced.client, headers={"traceparent": TRACEPARENT})
    reply = await peer.request("tools/call", {"name": "broken", "arguments": {}})
    assert reply.error["code"] == INTERNAL_ERROR
    downstream = only(of_kind(exporter, SpanKind.SERVER, "tools/call broken"))
    assert downstream.status.status_code is StatusCode.ERROR
    attributes = downstream.attributes or {}
    assert attributes["mcp_era_proxy.outcome"] == "error"
    assert attributes["error.type"] == attributes["rpc.response.status_code"] == str(INTERNAL_ERROR)


async def _failing() -> Outcome:
    return error(INTERNAL_ERROR, "the tool broke")


async def test_an_unreachable_upstream_fails_both_spans(
    aiohttp_server: Any, aiohttp_client: Any, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    proxy = await _proxy(aiohttp_server, aiohttp_client, provider, closed_port_url())
    response = await proxy.client.post(
        "/mcp", json=initialize_message(), headers={"Accept": ACCEPT, "traceparent": TRACEPARENT}
    )
    assert "error" in await response.json()  # initialize asks the upstream first: it cannot be reached
    downstream = only(of_kind(exporter, SpanKind.SERVER, "initialize"))
    assert downstream.status.status_code is StatusCode.ERROR
    assert (downstream.attributes or {})["mcp_era_proxy.outcome"] == "upstream_error"
    upstream = of_kind(exporter, SpanKind.CLIENT)
    assert upstream, "no upstream span"
    for span in upstream:
        assert parent_of(span) == hexes(downstream)[1]
        assert span.status.status_code is StatusCode.ERROR
        assert (span.attributes or {})["error.type"] == "UpstreamUnavailable"


async def test_a_refused_body_still_gets_its_span_parented_on_the_headers(
    traced: Proxy, exporter: InMemorySpanExporter
) -> None:
    response = await traced.client.post(
        "/mcp", data=b"{not json", headers={"Content-Type": "application/json", "traceparent": TRACEPARENT}
    )
    assert response.status == 400
    span = only(of_kind(exporter, SpanKind.SERVER))
    assert parent_of(span) == CLIENT_SPAN and span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["mcp_era_proxy.outcome"] == "rejected"
    assert (span.attributes or {})["http.response.status_code"] == 400


async def test_a_malformed_traceparent_starts_a_new_trace(traced: Proxy, exporter: InMemorySpanExporter) -> None:
    peer = await LegacyClient.connect(traced.client, headers={"traceparent": "00-not-a-trace-01"})
    assert peer.session_id
    span = only(of_kind(exporter, SpanKind.SERVER, "initialize"))
    assert span.parent is None


async def test_the_proxy_shuts_its_own_provider_down_exporting_what_is_left(
    aiohttp_server: Any, aiohttp_client: Any, fake: FakeModern
) -> None:
    """tracing.otlp_endpoint set: OTLP/HTTP export, batched, flushed when the proxy stops."""
    received: list[web.Request] = []
    bodies: list[bytes] = []

    async def collect(request: web.Request) -> web.Response:
        received.append(request)
        bodies.append(await request.read())
        return web.Response(status=200, content_type="application/x-protobuf")

    collector = web.Application()
    collector.router.add_post("/v1/traces", collect)
    collector_server = await aiohttp_server(collector)
    settings = load_settings(
        None,
        **{
            "upstream.url": fake.url,
            "upstream.era": "modern",
            "cache.watch": False,
            "tracing.otlp_endpoint": str(collector_server.make_url("/v1/traces")),
            "tracing.service_name": "proxy-under-test",
            "tracing.headers": {"X-Tenant": "t1"},
        },
    )
    app, _ = create_app(settings)
    client = await aiohttp_client(await serve(aiohttp_server, app))
    peer = await LegacyClient.connect(client, headers={"traceparent": TRACEPARENT})
    assert (await peer.request("tools/list")).status == 200
    assert not received  # batched: nothing sent yet (the batch waits up to 5 s)
    await client.close()  # the app's cleanup shuts the provider down: the batch is flushed
    assert received, "nothing was exported at shutdown"
    assert received[0].headers["X-Tenant"] == "t1"
    assert received[0].content_type == "application/x-protobuf"
    payload = b"".join(bodies)
    assert b"proxy-under-test" in payload and b"tools/list" in payload
    assert bytes.fromhex(CLIENT_TRACE) in payload


STDIO_SERVER = Path(__file__).resolve().parents[1] / "support" / "stdio_server.py"


@pytest.mark.parametrize("era", ["modern", "legacy"])
async def test_a_stdio_request_carries_its_upstream_spans_context_in_meta(
    aiohttp_server: Any, aiohttp_client: Any, provider: TracerProvider, exporter: InMemorySpanExporter, era: str
) -> None:
    """Modern: the one shared process; legacy: a process per session. No headers on stdio: `_meta`."""
    settings = load_settings(
        None,
        **{
            "upstream.command": [sys.executable, str(STDIO_SERVER)],
            "upstream.era": era,
            "upstream.env": {"STDIO_SERVER_ERA": era},
            "upstream.name": "scripted-stdio",
            "cache.watch": False,
        },
    )
    app, _ = create_app(settings, tracing=OtelTracing(provider))
    client = await aiohttp_client(await serve(aiohttp_server, app))
    async with asyncio.timeout(WAIT):
        if era == "modern":
            reply = await ModernClient(client, headers={"traceparent": TRACEPARENT}).request(
                "tools/call", {"name": "trace", "arguments": {}}
            )
            received = reply.result["content"][0]["text"]
        else:
            peer = await LegacyClient.connect(client, headers={"traceparent": TRACEPARENT})
            received = (await peer.request("tools/call", {"name": "trace", "arguments": {}})).result["content"][0][
                "text"
            ]
    downstream = only(of_kind(exporter, SpanKind.SERVER, "tools/call trace"))
    assert parent_of(downstream) == CLIENT_SPAN
    upstream = only(of_kind(exporter, SpanKind.CLIENT, "tools/call trace"))
    assert parent_of(upstream) == hexes(downstream)[1]
    assert (upstream.attributes or {})["network.transport"] == "pipe"
    assert received == traceparent_of(upstream)


def test_with_no_endpoint_nothing_of_opentelemetry_is_imported() -> None:
    """Off is free: the proxy, built and serving a request, never imports opentelemetry."""
    script = textwrap.dedent(
        """
        import asyncio, sys
        from aiohttp.test_utils import TestClient, TestServer
        from proxy.app import create_app
        from proxy.config import load_settings
        from proxy import tracing

        async def main():
            settings = load_settings(None, **{"upstream.url": "http://127.0.0.1:9/mcp", "upstream.era": "modern"})
            app, _ = create_app(settings)
            async with TestClient(TestServer(app)) as client:
                ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
                response = await client.post("/mcp", json=ping, headers={"traceparent": TRACEPARENT})
                assert response.status in (200, 400), response.status
            assert tracing.upstream(None, "http") is tracing.NULL_UPSTREAM

        TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        asyncio.run(main())
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry") or m == "proxy.tracing.otel")
        print(loaded)
        sys.exit(1 if loaded else 0)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


async def test_a_batch_the_endpoint_refuses_is_a_log_event_not_a_stray_line(
    aiohttp_server: Any, aiohttp_client: Any, fake: FakeModern
) -> None:
    async def refuse(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=400, text="bad batch")

    collector = web.Application()
    collector.router.add_post("/v1/traces", refuse)
    collector_server = await aiohttp_server(collector)
    settings = load_settings(
        None,
        **{
            "upstream.url": fake.url,
            "upstream.era": "modern",
            "cache.watch": False,
            "tracing.otlp_endpoint": str(collector_server.make_url("/v1/traces")),
        },
    )
    with capture_logs() as logs:
        app, _ = create_app(settings)
        client = await aiohttp_client(await serve(aiohttp_server, app))
        await LegacyClient.connect(client)
        await client.close()  # flushes: the endpoint answers 400
    events = [entry["event"] for entry in logs]
    assert "tracing_enabled" in events
    problems = [entry for entry in logs if entry["event"] == "tracing_export_problem"]
    assert problems and "400" in problems[0]["message"], logs


@pytest.mark.parametrize("era", ["modern", "legacy"])
async def test_an_http_sse_upstreams_exchange_is_an_http_post_span_not_a_pipe(
    aiohttp_server: Any, aiohttp_client: Any, provider: TracerProvider, exporter: InMemorySpanExporter, era: str
) -> None:
    """The SSE connection is spoken to like a stdio channel, but its messages are HTTP POSTs."""
    upstream = await aiohttp_server(FakeSseServer().app())
    settings = load_settings(
        None,
        **{"upstream.sse_url": str(upstream.make_url("/sse")), "upstream.name": "scripted-sse", "cache.watch": False},
    )
    app, _ = create_app(settings, tracing=OtelTracing(provider))
    client = await aiohttp_client(await serve(aiohttp_server, app))
    call = {"name": "echo", "arguments": {"text": "hi"}}
    async with asyncio.timeout(WAIT):
        if era == "modern":
            assert (await ModernClient(client).request("tools/call", call)).result["content"]
        else:
            peer = await LegacyClient.connect(client)
            assert (await peer.request("tools/call", call)).result["content"]
    span = only(of_kind(exporter, SpanKind.CLIENT, "tools/call echo"))
    attributes = span.attributes or {}
    assert attributes["network.transport"] == "tcp"
    assert attributes["http.request.method"] == "POST"

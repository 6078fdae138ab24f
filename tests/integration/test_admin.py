"""Health, readiness, metrics and the access log, on the proxy's own listener."""

from __future__ import annotations

import html
from urllib.parse import urlsplit

import structlog
from prometheus_client.parser import text_string_to_metric_families

from proxy.app import CACHE
from proxy.downstream.admin import STREAMS_IN_WORDS
from proxy.metrics import STREAM_KINDS
from tests.support.fake_modern import Call, FakeModern, Outcome, error
from tests.support.legacy_client import initialize_message
from tests.support.mcp_client import ACCEPT
from tests.support.modern_client import ModernClient

from .conftest import MakeProxy, Proxy, closed_port_url


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


async def test_healthz_answers_ok_while_the_process_runs(proxy: Proxy) -> None:
    response = await proxy.client.get("/healthz")
    assert response.status == 200
    assert await response.json() == {"status": "ok"}


async def test_readyz_is_ready_when_the_upstream_answers(proxy: Proxy, fake: FakeModern) -> None:
    response = await proxy.client.get("/readyz")
    assert response.status == 200
    body = await response.json()
    assert body["ready"] is True and body["upstream"] == proxy.settings.upstream.name
    assert any(r.method == "server/discover" for r in fake.calls)


async def test_readyz_reuses_a_recent_upstream_answer_instead_of_probing(proxy: Proxy, fake: FakeModern) -> None:
    await proxy.client.get("/readyz")
    probes = sum(r.method == "server/discover" for r in fake.calls)
    assert (await proxy.client.get("/readyz")).status == 200
    assert sum(r.method == "server/discover" for r in fake.calls) == probes


async def test_readyz_is_503_with_the_reason_when_the_upstream_is_unreachable(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(upstream_url=closed_port_url())
    response = await proxy.client.get("/readyz")
    assert response.status == 503
    body = await response.json()
    assert body["ready"] is False and "unreachable" in body["error"]


async def test_readyz_fails_with_the_reason_when_the_upstream_speaks_another_era_than_configured(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    """upstream.era: legacy in front of a 2026-07-28 server: every legacy initialize is refused
    with -32022, and /readyz said ready (the server answers, just not in that era)."""
    unsupported = error(-32022, "Unsupported protocol version", {"supported": ["2026-07-28"]}, status=400)

    async def refuse(call: Call) -> Outcome:  # what the SDK's 2026-07-28 servers answer a legacy initialize
        return unsupported

    fake.handlers["initialize"] = refuse
    proxy = await make_proxy(**{"upstream.era": "legacy"})
    with structlog.testing.capture_logs() as logs:
        refused = await proxy.client.post("/mcp", json=initialize_message(), headers={"Accept": ACCEPT})
        assert refused.status == 400 and (await refused.json())["error"]["code"] == -32022
        ready = await proxy.client.get("/readyz")
    assert ready.status == 503
    body = await ready.json()
    assert body["ready"] is False and "upstream.era is legacy" in body["error"] and "2026-07-28" in body["error"]
    assert [e["configured"] for e in logs if e["event"] == "upstream_era_mismatch"] == ["legacy"]
    again = await proxy.client.get("/readyz")  # a probe of the legacy era still fails: still not ready
    assert again.status == 503


async def test_readyz_is_not_ready_while_the_configured_legacy_era_s_handshake_fails_however_it_fails(
    make_proxy: MakeProxy, fake: FakeModern
) -> None:
    """upstream.era: legacy in front of a 2026-07-28 server that refuses initialize with -32601, not
    naming its versions (the spec asks for them, but does not require them): it answers, and every
    legacy initialize fails."""
    proxy = await make_proxy(**{"upstream.era": "legacy"})
    for _ in range(2):  # each poll runs the handshake again: it still fails
        ready = await proxy.client.get("/readyz")
        assert ready.status == 503
        body = await ready.json()
        assert body["ready"] is False and "initialize" in body["error"] and "Method not found" in body["error"]
    assert sum(r.method == "initialize" for r in fake.calls) == 2


async def test_readyz_is_not_ready_while_server_discover_fails_and_ready_once_it_works(
    proxy: Proxy, fake: FakeModern
) -> None:
    assert (await proxy.client.get("/readyz")).status == 200
    broken = error(-32603, "database down")

    async def failing(call: Call) -> Outcome:
        return broken

    working, fake.handlers["server/discover"] = fake.handlers["server/discover"], failing
    proxy.app[CACHE].clear("test")  # a legacy client's initialize asks the server now
    refused = await proxy.client.post("/mcp", json=initialize_message(), headers={"Accept": ACCEPT})
    assert "database down" in (await refused.json())["error"]["message"]
    ready = await proxy.client.get("/readyz")  # at once, though a probe worked within readiness.window_s
    assert ready.status == 503 and "database down" in (await ready.json())["error"]
    fake.handlers["server/discover"] = working
    assert (await proxy.client.get("/readyz")).status == 200


async def test_metrics_count_requests_by_method_eras_and_outcome(proxy: Proxy) -> None:
    peer = await proxy.connect()
    await peer.request("ping")
    await proxy.client.post("/mcp", data=b"{not json", headers={"Content-Type": "application/json"})
    response = await proxy.client.get("/metrics")
    assert response.status == 200
    text = await response.text()
    requests = samples(text, "mcp_era_proxy_requests_total")
    ok_ping = (("downstream_era", "legacy"), ("method", "ping"), ("outcome", "ok"), ("upstream_era", "modern"))
    assert requests[ok_ping] == 1
    rejected = [labels for labels, value in requests.items() if ("outcome", "rejected") in labels and value]
    assert rejected, requests
    assert samples(text, "mcp_era_proxy_sessions_open")[(("downstream_era", "legacy"),)] == 1


async def test_without_a_store_the_store_up_series_is_absent_not_zero(proxy: Proxy) -> None:
    # The chart's McpEraProxyStoreDown alert fires on `store_up == 0`: a proxy without a store
    # (the default, one replica) must not look like one whose store is down.
    await (await proxy.connect()).request("ping")
    text = await (await proxy.client.get("/metrics")).text()
    assert "mcp_era_proxy_store_up" not in text
    assert "mcp_era_proxy_sessions_open" in text  # the exposition itself is there


async def test_clients_names_each_client_with_its_version_protocol_version_era_and_counts(proxy: Proxy) -> None:
    legacy = await proxy.connect()  # initialize (a session opened) + notifications/initialized
    await legacy.request("tools/list")
    await ModernClient(proxy.client).request("server/discover")
    response = await proxy.client.get("/clients")
    assert response.status == 200
    rows = {row["name"]: row for row in (await response.json())["clients"]}
    old, new = rows["legacy-test-client"], rows["modern-test-client"]
    assert (old["version"], old["protocolVersion"], old["era"]) == ("0.0.1", legacy.version, "legacy")
    assert old["sessions"] == 1 and old["requests"] >= 2  # initialize and tools/list at least
    assert (new["version"], new["protocolVersion"], new["era"], new["sessions"]) == ("0.0.1", "2026-07-28", "modern", 0)
    text = await (await proxy.client.get("/metrics")).text()
    series = samples(text, "mcp_era_proxy_client_requests_total")
    labels = {(dict(k)["client"], dict(k)["protocol_version"], dict(k)["era"]) for k in series}
    assert {
        ("legacy-test-client", legacy.version, "legacy"),
        ("modern-test-client", "2026-07-28", "modern"),
    } <= (labels)


async def test_metric_method_labels_stay_bounded(proxy: Proxy, fake: FakeModern) -> None:
    peer = await proxy.connect()
    for n in range(3):
        await peer.request(f"vendor/custom-{n}")
    text = await (await proxy.client.get("/metrics")).text()
    methods = {dict(labels)["method"] for labels in samples(text, "mcp_era_proxy_requests_total")}
    assert "other" in methods
    assert not any(m.startswith("vendor/") for m in methods)
    # Vendor methods are forwarded, but by definition no schema describes them.
    fake.calls[:] = [c for c in fake.calls if not (c.method or "").startswith("vendor/")]


async def test_every_request_is_logged_once_with_eras_outcome_latency_and_a_hashed_session(proxy: Proxy) -> None:
    peer = await proxy.connect()
    with structlog.testing.capture_logs() as logs:
        await peer.request("ping")
    events = [e for e in logs if e["event"] == "request"]
    assert len(events) == 1
    event = events[0]
    assert event["method"] == "ping" and event["outcome"] == "ok" and event["status"] == 200
    assert event["downstream_era"] == "legacy" and event["upstream_era"] == "modern"
    assert isinstance(event["latency_ms"], float)
    assert event["session"] and event["session"] != peer.session_id and event["session"] not in peer.session_id


async def test_a_modern_request_the_unreachable_upstream_fails_is_counted_and_logged_as_modern(
    make_proxy: MakeProxy,
) -> None:
    """The era probe fails before the request reaches its relay: it was counted and logged as
    legacy, the record's default."""
    proxy = await make_proxy(upstream_url=closed_port_url(), **{"upstream.era": "auto"})
    with structlog.testing.capture_logs() as logs:
        reply = await ModernClient(proxy.client).request("tools/list")
        # No body to classify; its header declares 2026-07-28.
        unreadable = await proxy.client.post(
            "/mcp",
            data=b"{not json",
            headers={"Content-Type": "application/json", "MCP-Protocol-Version": "2026-07-28"},
        )
    assert reply.error is not None and unreadable.status == 400
    assert [(e["method"], e["downstream_era"]) for e in logs if e["event"] == "request"] == [
        ("tools/list", "modern"),
        (None, "modern"),
    ]
    requests = samples(await (await proxy.client.get("/metrics")).text(), "mcp_era_proxy_requests_total")
    modern = {
        dict(labels)["outcome"]: value for labels, value in requests.items() if ("downstream_era", "modern") in labels
    }
    assert modern == {"upstream_error": 1, "rejected": 1}
    assert not [labels for labels, value in requests.items() if ("downstream_era", "legacy") in labels and value]


async def test_an_unnamed_upstream_is_called_by_its_host_and_port_in_readiness_errors_and_the_status_page(
    make_proxy: MakeProxy,
) -> None:
    """Everything said "upstream 'upstream'" (upstream.name's default)."""
    url = closed_port_url()
    proxy = await make_proxy(upstream_url=url, **{"upstream.name": None, "upstream.era": "auto"})
    where = urlsplit(url).netloc  # 127.0.0.1:<port>
    assert (await (await proxy.client.get("/readyz")).json())["upstream"] == where
    reply = await ModernClient(proxy.client).request("tools/list")
    assert reply.error is not None and f"upstream '{where}'" in reply.error["message"], reply.error
    assert f"Upstream <b>{where}</b>" in await (await proxy.client.get("/")).text()
    errors = samples(await (await proxy.client.get("/metrics")).text(), "mcp_era_proxy_upstream_errors_total")
    assert {dict(labels)["upstream"] for labels in errors} == {where}


async def test_the_status_page_says_what_is_open_in_words_not_metric_labels(proxy: Proxy) -> None:
    """It showed "streams: downstream_get" and the like."""
    await (await proxy.connect()).request("ping")
    page = await (await proxy.client.get("/")).text()
    for words in STREAMS_IN_WORDS.values():
        assert f"<td>{html.escape(words)}</td><td>0</td>" in page
    assert "<td>legacy sessions (held here)</td><td>1</td>" in page
    assert not any(kind in page for kind in STREAM_KINDS), page

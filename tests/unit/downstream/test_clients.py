"""The migration report (proxy/downstream/clients.py): one bounded row per client, names cut to a safe form."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from prometheus_client import generate_latest

from proxy.downstream.clients import ClientReport, Sighting
from proxy.downstream.messages import ByteSessions, legacy_sighting
from proxy.metrics import Metrics
from tests.hostile import strategies as hs


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


def report(max_tracked: int = 100) -> tuple[ClientReport, Metrics]:
    metrics = Metrics()
    return ClientReport(max_tracked, metrics, clock=Clock()), metrics


def test_each_client_is_one_row_with_its_counts_features_and_times():
    clients, _ = report()
    legacy = {"name": "claude-desktop", "version": "0.9.1"}
    clients.seen(
        Sighting(legacy, "2025-06-18", "legacy", opened_session=True, extensions=["io.modelcontextprotocol/ui"])
    )
    clients.seen(Sighting(legacy, "2025-06-18", "legacy", input_round=True))
    clients.seen(Sighting({"name": "new-host", "version": "2.0"}, "2026-07-28", "modern", listen=True, task=True))
    new, old = clients.rows()  # the most recently seen first
    assert (new["name"], new["protocolVersion"], new["era"], new["features"]["listen"]) == (
        "new-host", "2026-07-28", "modern", 1
    )  # fmt: skip
    assert old["name"] == "claude-desktop" and old["version"] == "0.9.1" and old["protocolVersion"] == "2025-06-18"
    assert (old["requests"], old["sessions"], old["features"]["inputRounds"]) == (2, 1, 1)
    assert old["features"]["extensions"] == ["io.modelcontextprotocol/ui"]
    assert old["firstSeen"] < old["lastSeen"] and old["firstSeen"].endswith("Z")


def test_ten_thousand_distinct_names_stay_within_the_bound_in_rows_and_in_the_metric():
    clients, metrics = report(max_tracked=50)
    for n in range(10_000):
        clients.seen(Sighting({"name": f"client-{n}", "version": "1"}, "2025-11-25", "legacy"))
    rows = clients.rows()
    assert len(rows) == 51  # 50 named, then one `other`
    other = [row for row in rows if row["name"] == "other"]
    assert len(other) == 1 and other[0]["requests"] == 10_000 - 50
    series = [line for line in generate_latest(metrics.registry).decode().splitlines()
              if line.startswith("mcp_era_proxy_client_requests_total{")]  # fmt: skip
    assert len(series) == 51


def test_a_clients_strings_are_cut_to_a_safe_bounded_form_and_unknown_versions_say_other():
    clients, metrics = report()
    clients.seen(
        Sighting({"name": '<script>alert("x")</script>' + "a" * 200, "version": "1\n2"}, "1999-01-01", "legacy")
    )
    clients.seen(Sighting(None, None, "modern"))
    named, unnamed = clients.rows()[1], clients.rows()[0]
    assert "<" not in named["name"] and '"' not in named["name"] and len(named["name"]) <= 64
    assert named["version"] == "1_2" and named["protocolVersion"] == "other"
    assert (unnamed["name"], unnamed["version"]) == ("unknown", "unknown")
    assert "<script>" not in generate_latest(metrics.registry).decode()


def test_a_name_that_is_no_string_is_reported_as_unknown_and_breaks_nothing():
    clients, _ = report()
    clients.seen(Sighting({"name": ["a", "list"], "version": {"x": 1}}, "2025-11-25", "legacy"))
    clients.seen(Sighting({"name": ["a", "list"], "version": {"x": 1}}, "2025-11-25", "legacy"))
    [row] = clients.rows()
    assert (row["name"], row["version"], row["requests"]) == ("unknown", "unknown", 2)


def test_a_plain_request_counts_as_a_sighting_of_its_client_alone_would() -> None:
    plain, plain_metrics = report()
    full, full_metrics = report()
    for info, version in [({"name": "host", "version": "1"}, "2025-11-25"), (None, "2025-06-18"), ({"name": ["x"]}, 7)]:
        plain.seen_plain(info, version, "legacy")
        full.seen(Sighting(info, version, "legacy"))
    assert plain.rows() == full.rows()

    def exposed(metrics: Metrics) -> list[bytes]:
        return [line for line in generate_latest(metrics.registry).splitlines() if b"_created" not in line]

    assert exposed(plain_metrics) == exposed(full_metrics)


@pytest.mark.parametrize(
    ("body", "plain"),
    [
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo"}}, True),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo", "task": {}}}, False),
        ({"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"taskId": "t"}}, False),
        ({"jsonrpc": "2.0", "id": 1, "method": "resources/subscribe", "params": {"uri": "u"}}, False),
        ({"jsonrpc": "2.0", "id": 1, "result": {}}, False),  # an answer to the server's request
        ([{"jsonrpc": "2.0", "id": 1, "method": "ping"}], False),  # a batch is always sighted whole
        # Sighted before the endpoint checks the message (and refuses these with -32600).
        ({"jsonrpc": "2.0", "id": 1, "method": []}, True),
        ({"jsonrpc": "2.0", "id": 1, "method": {"a": 1}}, True),
        ([{"jsonrpc": "2.0", "id": 1, "method": {}}], False),
    ],
)
def test_a_legacy_message_is_plain_only_when_it_uses_no_counted_feature(body: object, plain: bool) -> None:
    sighting = legacy_sighting(body, {"name": "host"}, "2025-11-25")
    assert (sighting is None) is plain
    if sighting is not None:
        assert (sighting.client_info, sighting.protocol_version, sighting.era) == (
            {"name": "host"},
            "2025-11-25",
            "legacy",
        )


@settings(max_examples=300, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=hs.bodies, client_info=hs.json_values, version=hs.json_values)
def test_any_body_from_any_client_is_sighted_and_reported_without_an_error(
    body: object, client_info: object, version: object
) -> None:
    """What a legacy client sends, in its session, is sighted before the endpoint checks it: any
    JSON value, of a client whose initialize named anything (tests/hostile/strategies.py)."""
    clients, _ = report()
    sighting = legacy_sighting(body, client_info, version)
    if sighting is None:
        clients.seen_plain(client_info, version, "legacy")
    else:
        clients.seen(sighting)
    sessions = ByteSessions()
    for message in (body, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": body}):
        seen = sessions.sighting(message, "s-1", "s-1")
        if seen is not None:
            clients.seen(seen)
    rows = clients.rows()
    assert 1 <= len(rows) <= 3 and json.loads(json.dumps(rows)) == rows  # what the report serves


def test_a_legacy_http_upstream_s_session_names_its_client_for_every_message() -> None:
    sessions = ByteSessions()
    info = {"name": "host", "version": "1"}
    initialize = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "clientInfo": info, "capabilities": {}},
    }
    opened = sessions.sighting(initialize, None, "s-1")
    assert opened is not None and opened.opened_session
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo"}}  # a plain one
    seen = sessions.sighting(call, "s-1", None)
    assert seen == Sighting(info, "2025-06-18", "legacy")
    assert sessions.sighting(call, "s-unknown", None) is None

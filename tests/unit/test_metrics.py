"""The per-request metrics the proxy keeps itself (proxy/metrics.py, Tally and Timing) are exposed
exactly as prometheus_client's Counter and Histogram of the same names would be."""

from __future__ import annotations

import itertools
import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import metrics as prometheus_metrics

from proxy.metrics import PREFIX, Metrics, Tally, Timing

BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Each at, just below and just above a bucket's bound, and past the last: `le` is inclusive.
SECONDS = [0.0, 0.0001, 0.0005, 0.00051, 0.001, 0.3, 1.0, 1.0000001, 59.9, 60.0, 61.0, 3600.0]
KEYS = [
    ("tools/call", "legacy", "modern", "ok"),
    ("tools/call", "legacy", "modern", "error"),
    ("tools/list", "modern", "legacy", "ok"),
    ("other", "modern", "modern", "rejected"),
]


def reference() -> tuple[CollectorRegistry, Counter, Histogram]:
    registry = CollectorRegistry()
    counter = Counter(
        PREFIX + "requests_total",
        "Downstream JSON-RPC messages handled, by outcome.",
        ["method", "downstream_era", "upstream_era", "outcome"],
        registry=registry,
    )
    histogram = Histogram(
        PREFIX + "request_duration_seconds",
        "Time from receiving a downstream message to the end of its reply.",
        ["method", "downstream_era", "upstream_era"],
        registry=registry,
        buckets=BOUNDS,
    )
    return registry, counter, histogram


def without_created_values(text: bytes) -> str:
    """The exposition with the `_created` timestamps blanked (each side took its own)."""
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text.decode())


@pytest.mark.parametrize("created", [True, False])
def test_the_exposition_is_a_counters_and_a_histograms(monkeypatch: pytest.MonkeyPatch, created: bool) -> None:
    monkeypatch.setattr(prometheus_metrics, "_use_created", created)
    registry, counter, histogram = reference()
    ours_registry = CollectorRegistry()
    requests = Tally(counter._name + "_total", counter._documentation, tuple(counter._labelnames), ours_registry)
    timing = Timing(histogram._name, histogram._documentation, tuple(histogram._labelnames), BOUNDS, ours_registry)
    for key, seconds in zip(itertools.cycle(KEYS), SECONDS * 3, strict=False):
        counter.labels(*key).inc()
        histogram.labels(*key[:3]).observe(seconds)
        requests.labels(*key).inc()
        timing.observe(key[:3], seconds)
    expected, got = generate_latest(registry), generate_latest(ours_registry)
    assert without_created_values(got) == without_created_values(expected)
    assert (b"_created" in got) is created
    assert got.count(b"request_duration_seconds_bucket") == (len(BOUNDS) + 1) * 3  # three label sets, +Inf too


def test_a_sample_is_readable_from_the_registry_as_before() -> None:
    metrics = Metrics()
    metrics.observe_request("tools/call", "legacy", "modern", "ok", 0.002)
    metrics.observe_request("tools/call", "legacy", "modern", "ok", 0.2)
    labels = {"method": "tools/call", "downstream_era": "legacy", "upstream_era": "modern"}
    assert metrics.registry.get_sample_value(PREFIX + "requests_total", {**labels, "outcome": "ok"}) == 2
    assert (
        metrics.registry.get_sample_value(PREFIX + "request_duration_seconds_bucket", {**labels, "le": "0.0025"}) == 1
    )
    assert metrics.registry.get_sample_value(PREFIX + "request_duration_seconds_count", labels) == 2
    assert metrics.registry.get_sample_value(PREFIX + "request_duration_seconds_sum", labels) == pytest.approx(0.202)


@pytest.mark.parametrize("created", [True, False])
def test_a_tally_is_exposed_as_a_counter_of_its_name(monkeypatch: pytest.MonkeyPatch, created: bool) -> None:
    monkeypatch.setattr(prometheus_metrics, "_use_created", created)
    registry, ours_registry = CollectorRegistry(), CollectorRegistry()
    labels = ("client", "era")
    counter = Counter(PREFIX + "client_requests", "Requests by client.", labels, registry=registry)
    tally = Tally(PREFIX + "client_requests", "Requests by client.", labels, ours_registry)
    counter.labels("never", "legacy")
    tally.labels("never", "legacy")  # made, never counted: exported as 0
    for n, values in enumerate([("a", "legacy"), ("b", "modern"), ("a", "legacy")] * 4):
        counter.labels(*values).inc(n % 3 + 0.5)
        tally.labels(*values).inc(n % 3 + 0.5)
    expected, got = generate_latest(registry), generate_latest(ours_registry)
    assert without_created_values(got) == without_created_values(expected)
    assert (b"_created" in got) is created
    with pytest.raises(ValueError):
        tally.labels("only one")


def test_the_log_lines_lost_are_a_counter_read_where_they_are_counted() -> None:
    """proxy/logs.py counts them (its writer thread); the registry reads them at each scrape."""
    metrics = Metrics()
    assert metrics.registry.get_sample_value(PREFIX + "log_lines_lost_total") == 0
    lost = iter([3, 7])
    metrics.log_lines_lost.source = lambda: next(lost)
    registry = CollectorRegistry()
    Counter(PREFIX + "log_lines_lost", metrics.log_lines_lost.documentation, registry=registry).inc(3)
    expected = [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]
    exposition = generate_latest(metrics.registry).decode().splitlines()
    assert [line for line in exposition if "log_lines_lost" in line] == expected  # as a Counter of its name
    assert metrics.registry.get_sample_value(PREFIX + "log_lines_lost_total") == 7

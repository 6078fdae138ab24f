"""The parts of prometheus_client below its public API that the proxy relies on
(proxy/seams/prometheus_internals.py): their shape, and the behaviour each stands for."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import metrics as prometheus_metrics

from proxy.seams import prometheus_internals as seam


def test_the_installed_prometheus_client_has_every_part_the_proxy_relies_on() -> None:
    assert seam.problems() == []


def test_a_metric_says_what_it_was_made_with() -> None:
    registry = CollectorRegistry()
    assert seam.made_with(Counter("calls_total", "Calls.", ["method"], registry=registry)) == (
        "calls",
        "counter",
        ("method",),
        "Calls.",
    )
    assert seam.made_with(Gauge("open", "Open.", registry=registry)) == ("open", "gauge", (), "Open.")
    assert seam.made_with(Histogram("took_seconds", "Took.", ["a", "b"], registry=registry))[1:3] == (
        "histogram",
        ("a", "b"),
    )


def test_created_series_follow_prometheus_client_s_own_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = CollectorRegistry()
    Counter("calls_total", "Calls.", registry=registry)
    assert seam.created_series() == (b"calls_created" in generate_latest(registry))
    monkeypatch.setattr(prometheus_metrics, "_use_created", not seam.created_series())
    assert seam.created_series() == (b"calls_created" in generate_latest(registry))


def test_a_bound_is_rendered_as_prometheus_client_renders_its_le_label() -> None:
    registry = CollectorRegistry()
    bounds = (0.0005, 0.005, 1, 2.5, 30)
    Histogram("took_seconds", "Took.", buckets=bounds, registry=registry).observe(0.1)
    scraped = generate_latest(registry).decode()
    for bound in bounds:
        assert f'le="{seam.bound_label(bound)}"' in scraped


def test_a_metric_of_another_shape_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(prometheus_metrics, "_use_created")
    monkeypatch.setattr(seam, "bound_label", repr)
    assert seam.problems() == [
        "prometheus_client.metrics._use_created is missing",
        "prometheus_client.utils.floatToGoString is missing",
    ]
    assert seam.created_series()  # read as on

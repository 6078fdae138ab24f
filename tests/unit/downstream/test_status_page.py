"""The status page's HTML (proxy/downstream/status_page.py): whatever came from outside is text."""

from __future__ import annotations

from proxy.downstream.status_page import render

ROW = {
    "name": "<script>alert(1)</script>",
    "version": '"><img src=x>',
    "protocolVersion": "2025-06-18",
    "era": "legacy",
    "requests": 3,
    "sessions": 1,
    "firstSeen": "2026-12-03T10:00:00Z",
    "lastSeen": "2026-12-03T10:05:00Z",
    "features": {"inputRounds": 1, "listen": 0, "tasks": 0, "extensions": ["<i>x</i>"]},
}


def page(**changes: object) -> str:
    kwargs: dict[str, object] = {
        "upstream": "<b>up</b>",
        "upstream_era": "legacy",
        "ready": False,
        "reason": "<em>why</em>",
        "draining": False,
        "gauges": {"parked calls": 2.0, "upstream server processes": None},
        "store": "none",
        "clients": [ROW],
        "max_tracked": 100,
        "version": "0.1.0",
    }
    kwargs.update(changes)
    return render(**kwargs)  # type: ignore[arg-type]


def test_every_outside_value_is_escaped_and_the_page_needs_nothing_else():
    html = page()
    for raw in ("<script>", "<img", "<i>", "<em>", "<b>up</b>"):
        assert raw not in html, raw
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;em&gt;why&lt;/em&gt;" in html
    assert "http://" not in html and "https://" not in html and "<script" not in html  # nothing fetched, no script
    assert '<meta http-equiv="refresh"' in html


def test_readiness_and_the_legacy_rows_are_marked():
    assert 'class="bad">not ready' in page() and 'class="ok">ready' in page(ready=True, reason=None)
    assert 'class="bad">draining' in page(ready=True, draining=True)
    assert '<tr class="legacy">' in page()
    assert "<td>2</td>" in page() and "<td>-</td>" in page()  # a gauge not exported here: a dash


def test_a_clients_features_are_said_in_words():
    row = {**ROW, "features": {"inputRounds": 2, "listen": 1, "tasks": 0, "extensions": ["io.example/ui"]}}
    html = page(clients=[row])
    assert "<td>input rounds 2, listens 1, extension io.example/ui</td>" in html
    assert "inputRounds" not in html

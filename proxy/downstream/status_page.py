"""The status page for people (`GET /` on the admin listener), in the spirit of HAProxy's stats page:
one small server-rendered HTML page, no script, nothing fetched from elsewhere, refreshing itself.
It shows the upstream and its era, readiness and why, what is open now (sessions, streams, parked
calls, upstream sessions and processes), the store, and the migration report as a table. Every
value that came from outside (client names, versions, reasons) is escaped: shown as text, never
as markup.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any

REFRESH_S = 5

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em;margin:0 0 .2em}h2{font-size:1.05em;margin:1.4em 0 .4em}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#f0f0f0}.ok{color:#176b2c;font-weight:600}.bad{color:#a01616;font-weight:600}
.legacy{background:#fff4e0}small{color:#666}
"""


# The migration report's feature counts (clients.py ClientReport rows) in words.
_FEATURES = {"inputRounds": "input rounds", "listen": "listens", "tasks": "tasks"}


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _table(headers: Iterable[str], rows: Iterable[Iterable[object]], row_class: Iterable[str] | None = None) -> str:
    classes = list(row_class) if row_class is not None else None
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{_e(classes[i])}"' if classes and classes[i] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{_e(cell)}</td>" for cell in row) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body) or '<tr><td colspan=99>none yet</td></tr>'}</table>"


def render(
    *,
    upstream: str,
    upstream_era: str,
    ready: bool,
    reason: str | None,
    draining: bool,
    gauges: Mapping[str, float | None],
    store: str,
    clients: list[dict[str, Any]],
    max_tracked: int,
    version: str,
) -> str:
    """The page. `gauges`: label -> value (None: not exported here)."""
    state = "draining (shutting down)" if draining else "ready" if ready else "not ready"
    css = "ok" if ready and not draining else "bad"
    why = f" <small>({_e(reason)})</small>" if reason else ""
    now_rows = [(label, "-" if value is None else f"{value:g}") for label, value in gauges.items()]
    client_rows = [
        (
            c["name"],
            c["version"],
            c["protocolVersion"],
            c["era"],
            c["requests"],
            c["sessions"],
            c["firstSeen"],
            c["lastSeen"],
            ", ".join(
                [f"{_FEATURES.get(k, k)} {v}" for k, v in c["features"].items() if k != "extensions" and v]
                + [f"extension {extension}" for extension in c["features"]["extensions"]]
            ),
        )
        for c in clients
    ]
    legacy = sum(c["requests"] for c in clients if c["era"] == "legacy")
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="refresh" content="{REFRESH_S}">'
        "<meta name=viewport content='width=device-width'>"
        f"<title>mcp-era-proxy: {_e(upstream)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>mcp-era-proxy <small>{_e(version)}</small></h1>"
        f"<p>Upstream <b>{_e(upstream)}</b>, era <b id=era>{_e(upstream_era)}</b>. "
        f'Readiness: <span id=ready class="{css}">{_e(state)}</span>{why}</p>'
        "<h2>Now</h2>"
        + _table(("what", "open"), now_rows)
        + f"<p>Store: <span id=store>{_e(store)}</span></p>"
        + f"<h2>Clients <small>(migration report, this replica; {legacy} legacy requests; "
        f"at most {max_tracked} named)</small></h2>"
        + _table(
            ("client", "version", "protocol", "era", "requests", "sessions", "first seen", "last seen", "features"),
            client_rows,
            ["legacy" if c["era"] == "legacy" else "" for c in clients],
        )
        + f"<p><small>Refreshes every {REFRESH_S} s. JSON: /clients, /readyz, /metrics.</small></p>"
        "</body></html>"
    )

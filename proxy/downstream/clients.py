"""Who still speaks which protocol: the migration report (docs/migrate.md, "Retiring the bridge").

One row per client the proxy has seen, by its `clientInfo` name and version, its protocol version
and its era: how many requests and sessions, when first and last seen, and which translated
features it used. Served as JSON on the admin listener (`GET /clients`), as the status page's
table, and counted in `mcp_era_proxy_client_requests_total`.

Bounded: at most `clients.max_tracked` distinct clients are kept (and labelled in the metric);
later ones share the row and label `other`. Names and versions are client input: they are cut to a
printable, bounded form before they become a label or a row, and the page shows them as text.
Per replica: rows live in this process only (no store write per request); across replicas the
metric is the aggregate (Prometheus sums it), the page and /clients show this replica's share.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..metrics import Metrics
from ..protocol.versions import LEGACY_VERSIONS, MODERN_VERSIONS

OTHER = "other"
_NAME_MAX = 64
_VERSION_MAX = 32
_UNSAFE = re.compile(r"[^A-Za-z0-9 ._+:/@()\-]")
_KNOWN_VERSIONS = frozenset((*LEGACY_VERSIONS, *MODERN_VERSIONS))


def clean(value: object, limit: int) -> str:
    """A client's own string as the report keeps it: printable ASCII of a known set, bounded."""
    if not isinstance(value, str) or not value.strip():
        return "unknown"
    return _UNSAFE.sub("_", value.strip())[:limit]


@dataclass(slots=True)
class ClientRow:
    name: str
    version: str
    protocol_version: str
    era: str
    first_seen: float
    last_seen: float
    requests: int = 0
    sessions: int = 0
    input_rounds: int = 0
    listens: int = 0
    tasks: int = 0
    extensions: set[str] = field(default_factory=set)
    counter: Any = None  # its cell of mcp_era_proxy_client_requests_total (resolved once)

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "protocolVersion": self.protocol_version,
            "era": self.era,
            "requests": self.requests,
            "sessions": self.sessions,
            "firstSeen": _iso(self.first_seen),
            "lastSeen": _iso(self.last_seen),
            "features": {
                "inputRounds": self.input_rounds,
                "listen": self.listens,
                "tasks": self.tasks,
                "extensions": sorted(self.extensions),
            },
        }


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


@dataclass(slots=True)  # not frozen: made for every request, and frozen fields cost a call each
class Sighting:
    """One request of a client, as the endpoint saw it."""

    client_info: object  # the clientInfo it declared (initialize, or the request's _meta)
    protocol_version: object
    era: str  # "legacy" | "modern"
    opened_session: bool = False
    input_round: bool = False  # it answered the server's input request(s)
    listen: bool = False  # subscriptions/listen, resources/subscribe, or a GET stream
    task: bool = False  # a task-augmented call or a tasks/* request
    extensions: Iterable[str] = ()


class ClientReport:
    def __init__(self, max_tracked: int, metrics: Metrics, clock: Callable[[], float] = time.time) -> None:
        self._max = max_tracked
        self._metrics = metrics
        self._clock = clock
        self._rows: dict[tuple[str, str, str, str], ClientRow] = {}
        # The row of each client as it spells itself: one dict lookup per request on the hot path,
        # not two regular expressions and a labelled child. Bounded like the rows (cleared if full).
        self._spelled: dict[tuple[object, object, object, str], ClientRow] = {}

    def seen(self, sighting: Sighting) -> None:
        row = self._spelled_row(sighting.client_info, sighting.protocol_version, sighting.era)
        row.last_seen = self._clock()
        row.requests += 1
        if sighting.opened_session or sighting.input_round or sighting.listen or sighting.task:  # few do
            row.sessions += sighting.opened_session
            row.input_rounds += sighting.input_round
            row.listens += sighting.listen
            row.tasks += sighting.task
        # Bounded; only ids not seen as they are cost a regular expression.
        if sighting.extensions and len(row.extensions) < 64:
            row.extensions.update(
                clean(e, _NAME_MAX) for e in list(sighting.extensions)[:64] if e not in row.extensions
            )
        row.counter.value += 1  # its TallyCell, counted in place: once per request

    def seen_plain(self, client_info: object, protocol_version: object, era: str) -> None:
        """One request that used none of the features the report counts (most of them): what
        `seen` does with a Sighting of only these three."""
        row = self._spelled_row(client_info, protocol_version, era)
        row.last_seen = self._clock()
        row.requests += 1
        row.counter.value += 1

    def _spelled_row(self, client_info: object, protocol_version: object, era: str) -> ClientRow:
        info = client_info if isinstance(client_info, dict) else {}
        raw = (info.get("name"), info.get("version"), protocol_version, era)
        try:
            row = self._spelled.get(raw)
        except TypeError:  # a name or version that is no string (a list): not kept by spelling
            row = None
        if row is None:
            row = self._row(info, protocol_version, era)
            if len(self._spelled) >= 4 * self._max:
                self._spelled.clear()
            if all(isinstance(part, str | None) for part in raw):
                self._spelled[raw] = row
        return row

    def _row(self, info: dict[str, Any], version: object, era: str) -> ClientRow:
        key = (
            clean(info.get("name"), _NAME_MAX),
            clean(info.get("version"), _VERSION_MAX),
            version if isinstance(version, str) and version in _KNOWN_VERSIONS else OTHER,
            era,
        )
        row = self._rows.get(key)
        if row is None:
            if len(self._rows) >= self._max:  # bounded: the rest share one row and one label
                key = (OTHER, OTHER, key[2], key[3])
                row = self._rows.get(key)
            if row is None:
                now = self._clock()
                row = self._rows[key] = ClientRow(*key, first_seen=now, last_seen=now)
                row.counter = self._metrics.client_requests.labels(*key)
        return row

    def rows(self) -> list[dict[str, Any]]:
        """Every row, the most recently seen first."""
        return [row.as_json() for row in sorted(self._rows.values(), key=lambda r: -r.last_seen)]

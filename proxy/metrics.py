"""Prometheus metrics on an injected registry, with bounded label values."""

from __future__ import annotations

import asyncio
import functools
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from .seams.prometheus_internals import bound_label, created_series, made_with

PREFIX = "mcp_era_proxy_"

# Every method either era defines; anything else is reported as "other".
KNOWN_METHODS = frozenset(
    {
        "initialize",
        "ping",
        "server/discover",
        "tools/list",
        "tools/call",
        "prompts/list",
        "prompts/get",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "resources/subscribe",
        "resources/unsubscribe",
        "subscriptions/listen",
        "logging/setLevel",
        "completion/complete",
        "tasks/get",
        "tasks/result",
        "tasks/cancel",
        "tasks/list",
        "tasks/update",
        "notifications/initialized",
        "notifications/cancelled",
        "notifications/progress",
        "notifications/roots/list_changed",
        "sampling/createMessage",
        "elicitation/create",
        "roots/list",
        # Not methods: a client's reply to a server request, and a 2025-03-26 batch.
        "response",
        "batch",
    }
)
OUTCOMES = ("ok", "error", "rejected", "cancelled", "upstream_error", "shutdown")
# The kinds of `streams_open`, exported (as 0) from the start.
STREAM_KINDS = ("downstream_get", "downstream_listen", "downstream_sse", "upstream_listen")
STORE_READ_SOURCES = ("copy", "recent", "store")  # where a session record came from (store_session_reads)


def method_label(method: object) -> str:
    return method if isinstance(method, str) and method in KNOWN_METHODS else "other"


class TallyCell:
    """One labelled series of a Tally: `inc` adds to a plain number."""

    __slots__ = ("created", "value")

    def __init__(self, created: float) -> None:
        self.value = 0.0
        self.created = created

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class Tally(Collector):
    """A counter the hot path adds to (once per request or more): `labels(...)` gives a cell whose
    `inc` adds to a plain number, exported when scraped exactly as a prometheus_client Counter of
    this name would be (its `_created` series too). That Counter's children take a lock and check
    they are observable on every `inc`; the event loop's thread both counts and serves /metrics."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name.removesuffix("_total")
        self.documentation = documentation
        self.labelnames = labelnames
        self._clock = clock
        self._cells: dict[tuple[str, ...], TallyCell] = {}
        registry.register(self)

    def labels(self, *values: str) -> TallyCell:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: {len(self.labelnames)} label values expected, got {values!r}")
        cell = self._cells.get(values)
        if cell is None:
            cell = self._cells[values] = TallyCell(self._clock())
        return cell

    @property
    def documented(self) -> tuple[tuple[str, str, tuple[str, ...], str], ...]:
        return ((self.name, "counter", self.labelnames, self.documentation),)

    def collect(self) -> Iterator[Metric]:
        created = created_series()
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, cell in self._cells.items():
            family.add_metric(values, cell.value, created=cell.created if created else None)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)


class Timing(Collector):
    """A histogram every request observes: the count in each bucket and the sum kept as plain
    numbers, exported when scraped exactly as a prometheus_client Histogram of this name would be
    (its `_created` series too). That Histogram takes a lock and walks its buckets in Python on
    every observation; the event loop's thread both observes and serves /metrics."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        bounds: tuple[float, ...],
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self._bounds = bounds
        self._le = (*(bound_label(bound) for bound in bounds), "+Inf")
        self._clock = clock
        # Per label values: the count in each bucket (the last one +Inf), then the sum, then when
        # the series was created. Label values are bounded by their callers, so this stays small.
        self._series: dict[tuple[str, ...], list[float]] = {}
        registry.register(self)

    def observe(self, values: tuple[str, ...], seconds: float) -> None:
        timed = self._series.get(values)
        if timed is None:
            timed = self.series(values)
        timed[bisect_left(self._bounds, seconds)] += 1  # the first bound >= seconds, as `le` means
        timed[-2] += seconds

    def series(self, values: tuple[str, ...]) -> list[float]:
        """The numbers of one label set (made at first use): the count in each bucket (the last
        one +Inf), the sum, when the series was created."""
        timed = self._series.get(values)
        if timed is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: {len(self.labelnames)} label values expected, got {values!r}")
            timed = self._series[values] = [0] * len(self._le) + [0.0, self._clock()]
        return timed

    @property
    def bounds(self) -> tuple[float, ...]:
        return self._bounds

    @property
    def documented(self) -> tuple[tuple[str, str, tuple[str, ...], str], ...]:
        return ((self.name, "histogram", self.labelnames, self.documentation),)

    def collect(self) -> Iterator[Metric]:
        created = created_series()
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, timed in self._series.items():
            buckets, total = [], 0.0
            for le, count in zip(self._le, timed, strict=False):
                total += count
                buckets.append((le, total))
            family.add_metric(values, buckets, timed[-2])
            if created:
                series = dict(zip(self.labelnames, values, strict=True))
                family.samples.append(Sample(self.name + "_created", series, timed[-1]))
        yield family

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)


class Reading(Collector):
    """A counter kept outside the registry and read when scraped: `source` gives its value (set by
    whoever keeps it; 0 until then). The log lines lost are counted by proxy/logs.py's writer
    thread, which this module does not import: the composition root connects them."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.name = name.removesuffix("_total")
        self.documentation = documentation
        self.source: Callable[[], float] = lambda: 0.0
        registry.register(self)

    @property
    def documented(self) -> tuple[tuple[str, str, tuple[str, ...], str], ...]:
        return ((self.name, "counter", (), self.documentation),)

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.documentation, value=self.source())

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.documentation)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        # Every downstream message counts in these two.
        self.requests = Tally(
            PREFIX + "requests_total",
            "Downstream JSON-RPC messages handled, by outcome.",
            ("method", "downstream_era", "upstream_era", "outcome"),
            r,
        )
        self.request_duration = Timing(
            PREFIX + "request_duration_seconds",
            "Time from receiving a downstream message to the end of its reply.",
            ("method", "downstream_era", "upstream_era"),
            (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            r,
        )
        self._duration_bounds = self.request_duration.bounds
        self._request_cells: dict[tuple[str, str, str, str], tuple[TallyCell, list[float]]] = {}
        self.sessions_open = Gauge(
            PREFIX + "sessions_open", "Legacy sessions currently held by the proxy.", ["downstream_era"], registry=r
        )
        self.sessions_expired = Counter(
            PREFIX + "sessions_expired_total", "Legacy sessions closed for being idle too long.", registry=r
        )
        self.streams_open = Gauge(
            PREFIX + "streams_open", "Long-lived streams currently open, by kind.", ["kind"], registry=r
        )
        self.upstream_errors = Counter(
            PREFIX + "upstream_errors_total",
            "Failures talking to the upstream, by kind: unavailable, timeout, invalid (a reply that is not valid "
            "MCP), http (an error status, relayed or turned into -32010), session_gone (a legacy session the "
            "upstream forgot).",
            ["upstream", "kind"],
            registry=r,
        )
        self.input_rounds = Counter(
            PREFIX + "input_rounds_total", "Multi round-trip input rounds relayed.", ["direction", "method"], registry=r
        )
        self.tasks = Counter(
            PREFIX + "tasks_total",
            "Tasks hosted for 2025-11-25 clients, by event: created, cancelled (by tasks/cancel), and how "
            "each call ended (completed, failed).",
            ["event"],
            registry=r,
        )
        self.forwards = Counter(
            PREFIX + "forwards_total",
            "Echoes forwarded to the replica holding what they name: kind resume (a requestState "
            "retry), deliver (a legacy client's answer), subscribe (to the GET stream's replica), sse "
            "(an HTTP+SSE client's message, to the replica holding its stream) or task (a tasks/update, "
            "tasks/result or tasks/cancel, to the replica running the task); "
            "outcome ok, owner_gone or refused.",
            ["kind", "outcome"],
            registry=r,
        )
        self.upstream_sessions = Gauge(
            PREFIX + "upstream_sessions_open",
            "Legacy sessions the proxy holds with the upstream.",
            ["upstream"],
            registry=r,
        )
        self.upstream_sse_sessions = Gauge(
            PREFIX + "upstream_sse_sessions",
            "SSE connections open with an HTTP+SSE (2024-11-05) server (legacy client sessions, pooled sessions).",
            ["upstream"],
            registry=r,
        )
        self.upstream_processes = Gauge(
            PREFIX + "upstream_processes",
            "stdio server processes running (sessions of legacy clients, pooled sessions, the shared one).",
            ["upstream"],
            registry=r,
        )
        self.upstream_reinitialized = Counter(
            PREFIX + "upstream_sessions_reinitialized_total",
            "Upstream legacy sessions opened again after the upstream forgot them (HTTP 404).",
            ["upstream"],
            registry=r,
        )
        self.parked_calls = Gauge(
            PREFIX + "parked_calls", "Legacy upstream calls waiting for a modern client's input.", registry=r
        )
        self.cache_requests = Counter(
            PREFIX + "cache_requests_total",
            "Cacheable requests: hit (served from memory), miss (asked upstream), shared (joined a concurrent miss); "
            "scope public, private, or none (the answer could not be cached).",
            ["result", "scope"],
            registry=r,
        )
        self.cache_evictions = Counter(
            PREFIX + "cache_evictions_total",
            "Entries dropped for memory (lru) or age (expired).",
            ["reason", "scope"],
            registry=r,
        )
        self.cache_invalidations = Counter(
            PREFIX + "cache_invalidations_total",
            "Entries dropped because the upstream said they changed (reason list_changed, resources_updated) or "
            "the answers may differ now (era_changed, version_renegotiated).",
            ["scope", "reason"],
            registry=r,
        )
        self.cache_entries = Gauge(PREFIX + "cache_entries", "Entries in the response cache.", registry=r)
        self.cache_bytes = Gauge(PREFIX + "cache_bytes", "Serialized size of the response cache.", registry=r)
        self.store_errors = Counter(
            PREFIX + "store_errors_total",
            "Shared store calls that failed (kind error), timed out (timeout) or were refused at once while the "
            "breaker was open (rejected), by op: load, save, add, remove, touch, round, task, ping.",
            ["op", "kind"],
            registry=r,
        )
        self.store_session_reads = Tally(  # every legacy request with a shared store
            PREFIX + "store_session_reads_total",
            "Session records legacy requests needed from the shared store, by where they came from: copy "
            "(this replica's copy, kept while Redis reports changes: store.tracking), recent (read less than "
            "store.read_cache_ms ago), store (a round trip). All store while tracking is on: its connection "
            "is down (store_tracking_down in the log).",
            ("source",),
            r,
        )
        self.client_requests = Tally(  # every request
            PREFIX + "client_requests",
            "Downstream requests by client (clientInfo name and version, cut to a bounded form; past "
            "clients.max_tracked distinct clients, `other`), protocol version and era: who still speaks legacy.",
            ("client", "client_version", "protocol_version", "era"),
            r,
        )
        self.streams_resumed = Counter(
            PREFIX + "streams_resumed_total",
            "Legacy POST streams a client resumed (GET + Last-Event-ID); lost: the request had ended.",
            ["outcome"],
            registry=r,
        )
        self.sessions_resurrected = Counter(
            PREFIX + "sessions_resurrected_total",
            "Legacy sessions served again from their id after the shared store lost their record.",
            registry=r,
        )
        self.token_checks = Counter(
            PREFIX + "token_checks_total",
            "Access tokens checked against auth.issuers: result verified (signature checked), cached "
            "(verified before, still valid), invalid (401 invalid_token), missing (resource_server, no "
            "token), insufficient_scope (403) or keys_unavailable (the issuer's keys unreachable: 503).",
            ["result"],
            registry=r,
        )
        self.log_lines_lost = Reading(
            PREFIX + "log_lines_lost_total",
            "Log lines the process could not write: its log stream did not keep up (a full pipe: lines "
            "are dropped rather than wait) or failed (a closed pipe, a full disk). The first loss is also "
            "said once on stderr (log_lines_lost) when stderr can be written.",
            r,
        )
        # Where a leak of the proxy's own shows first: the tasks on its event loop, read at scrape time.
        self.event_loop_tasks = Gauge(
            PREFIX + "event_loop_tasks",
            "Tasks alive on the event loop: back to its idle value once traffic stops, or something leaks.",
            registry=r,
        )
        self.event_loop_tasks.set_function(_loop_tasks)
        for kind in STREAM_KINDS:
            self.streams_open.labels(kind)
        for source in STORE_READ_SOURCES:
            self.store_session_reads.labels(source)
        self.sessions_open.labels("legacy")

    def described(self) -> list[tuple[str, str, tuple[str, ...], str]]:
        """(family name, type, label names, meaning) of every metric registered here (a counter's
        series is its name with `_total`): what the reference page lists and the deploy checks
        hold the dashboard and alerts to."""
        out: list[tuple[str, str, tuple[str, ...], str]] = [
            made_with(value) for value in vars(self).values() if isinstance(value, MetricWrapperBase)
        ]
        out += [
            entry
            for value in vars(self).values()
            if isinstance(value, Tally | Timing | Reading)
            for entry in value.documented
        ]
        return sorted(out)

    def observe_request(
        self, method: str, downstream_era: str, upstream_era: str, outcome: str, seconds: float
    ) -> None:
        """One downstream message handled: counted by outcome, its time observed. Once per
        message: both series are found with one lookup (label values are bounded by the callers)."""
        key = (method, downstream_era, upstream_era, outcome)
        cells = self._request_cells.get(key)
        if cells is None:
            cells = self._request_cells[key] = (self.requests.labels(*key), self.request_duration.series(key[:3]))
        cells[0].value += 1
        timed = cells[1]
        timed[bisect_left(self._duration_bounds, seconds)] += 1
        timed[-2] += seconds

    @functools.cached_property
    def store_up(self) -> Gauge:
        """Registered by the first store that reports (proxy/state/redis_store.py): without a store the
        series is absent, not 0, so an alert on `== 0` means a store that does not answer."""
        return Gauge(
            PREFIX + "store_up",
            "1 while the shared store answers (its breaker closed), 0 while it does not; absent without one.",
            registry=self.registry,
        )


def _loop_tasks() -> float:
    try:
        return float(len(asyncio.all_tasks()))
    except RuntimeError:  # scraped from a thread without a running loop
        return 0.0

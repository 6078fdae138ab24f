"""The parts of prometheus_client below its public API that the proxy uses: what a metric object
was made with (its name, type, label names and help: the reference page and the deploy checks list
them), prometheus_client's own switch for `_created` series, and its rendering of a bucket bound.
`problems()` says what of that shape the installed version lacks; each has a fallback that keeps
the metrics served (the switch read as on, bounds rendered with `repr`)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import metrics
from prometheus_client.metrics import MetricWrapperBase

_MADE_WITH = ("_name", "_type", "_labelnames", "_documentation")


def made_with(metric: MetricWrapperBase) -> tuple[str, str, tuple[str, ...], str]:
    """(family name, type, label names, help) of a Counter, Gauge, Histogram or Summary."""
    name, kind, labels, documentation = (getattr(metric, attribute) for attribute in _MADE_WITH)
    return str(name), str(kind), tuple(labels), str(documentation)


def created_series() -> bool:
    """Whether `_created` series are exported: prometheus_client's own switch (an environment
    variable read at import, or disable_created_metrics())."""
    return bool(getattr(metrics, "_use_created", True))


def _go_float() -> Callable[[float], str]:
    try:
        from prometheus_client.utils import floatToGoString
    except ImportError:
        return repr
    return floatToGoString


# A bucket bound as prometheus_client renders it in `le` ("0.005", "1.0", "+Inf").
bound_label: Callable[[float], str] = _go_float()


def problems() -> list[str]:
    """What the installed prometheus_client lacks of the shape above (empty: all there)."""
    found: list[str] = []
    probe = metrics.Counter("probe", "probe", ["label"], registry=None)
    for attribute in _MADE_WITH:
        if not hasattr(probe, attribute):
            found.append(f"a metric's {attribute} is missing")
    if not isinstance(getattr(metrics, "_use_created", None), bool):
        found.append("prometheus_client.metrics._use_created is missing")
    if bound_label is repr:
        found.append("prometheus_client.utils.floatToGoString is missing")
    return found


__all__ = ["bound_label", "created_series", "made_with", "problems"]

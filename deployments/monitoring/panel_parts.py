"""The parts the dashboard's panels are built of (`dashboard_panels`): each query's metric taken from its
`MetricSpec` (metrics.py), so that a renamed or removed metric fails at import, and the panel shapes
that several rows share (a rate, a gauge per replica, quantiles, a cache's hits and size).
"""

from __future__ import annotations

from typing import Any

from ray.dashboard.modules.metrics.dashboards.common import Panel, Target

from deployments.monitoring.metrics import SPECS, MetricSpec

_SPECS = {spec.name: spec for spec in SPECS}

# Every series is narrowed by the dashboard's variables. `{global_filters}` stays last: Ray's
# factory formats each expr with str.format (hence the doubled braces below) and, when there are
# no global filters, drops the trailing comma this leaves.
_FILTER = 'application=~"$application", deployment=~"$deployment", model=~"$model", {global_filters}'
_QUANTILES = (0.5, 0.95, 0.99)


def spec(name: str, kind: str | None = None) -> MetricSpec:
    """The declared metric `name`, checked to be a `kind` when one is given."""
    if name not in _SPECS:
        raise KeyError(f"the dashboard reads {name!r}, which metrics.SPECS does not declare")
    spec = _SPECS[name]
    if kind and spec.kind != kind:
        raise ValueError(f"{spec.full_name} is a {spec.kind}, the dashboard reads it as a {kind}")
    return spec


def series(spec: MetricSpec, suffix: str = "", matchers: str = "") -> str:
    """`spec`'s series under the dashboard's filters; `suffix`: a histogram's `_bucket`, `_sum`, `_count`."""
    return f"{spec.exported}{suffix}{{{{{matchers}{_FILTER}}}}}"


def rate(name: str, by: str = "") -> str:
    """Counter `name`'s per-second rate, summed (by `by` when given)."""
    per_second = f"rate({series(spec(name, 'counter'))}[$interval])"
    return f"sum by ({by}) ({per_second})" if by else f"sum({per_second})"


def gauge(name: str, by: str, agg: str = "sum") -> str:
    """Gauge `name` aggregated (`agg`) by `by`."""
    return f"{agg} by ({by}) ({series(spec(name, 'gauge'))})"


def quantile_targets(name: str, by: str = "model") -> list[Target]:
    """p50/p95/p99 of a histogram over `$interval`, one line per `by` value."""
    buckets = series(spec(name, "histogram"), "_bucket")
    return [
        Target(
            expr=f"histogram_quantile({q}, sum by (le, {by}) (rate({buckets}[$interval])))",
            legend=f"p{round(q * 100)} {{{{{by}}}}}",
        )
        for q in _QUANTILES
    ]


def panel(panel_id: int, title: str, name: str, unit: str, targets: list[Target], note: str = "", **kw: Any) -> Panel:
    """A panel whose description is its metric's own (metrics.py), then `note`."""
    description = " ".join(filter(None, [spec(name).description, note]))
    return Panel(id=panel_id, title=title, description=description, unit=unit, targets=targets, **kw)


def hits_panel(panel_id: int, title: str, cache: str) -> Panel:
    """A cache's hits and misses per second (`<cache>_hits`, `<cache>_misses`)."""
    targets = [
        Target(expr=rate(f"{cache}_hits"), legend="hits"),
        Target(expr=rate(f"{cache}_misses"), legend="misses"),
    ]
    return panel(panel_id, title, f"{cache}_hits", "short", targets, note=spec(f"{cache}_misses").description)


def size_panels(entries_id: int, bytes_id: int, title: str, cache: str) -> list[Panel]:
    """A cache's entries and bytes per replica (`<cache>_entries`, `<cache>_bytes`)."""
    return [
        panel(entries_id, f"{title} entries", f"{cache}_entries", "short", [per_replica(f"{cache}_entries")]),
        panel(bytes_id, f"{title} bytes", f"{cache}_bytes", "bytes", [per_replica(f"{cache}_bytes")]),
    ]


def per_replica(name: str) -> Target:
    """Gauge `name`, one line per replica."""
    return Target(expr=gauge(name, "replica"), legend="{{replica}}")


def latency_panel(panel_id: int, title: str, name: str, by: str = "model") -> Panel:
    """A panel of histogram `name`'s p50, p95 and p99, one line per `by` value."""
    return panel(panel_id, title, name, "s", quantile_targets(name, by), fill=0, stack=False, linewidth=2)

"""A metrics recorder for tests without Ray."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from deployments.monitoring.metrics import Recorder


class FakeMetrics(Recorder):
    """A `Recorder` that keeps what it was given instead of sending it to Ray: `counts[(name, tags)]`
    adds up `inc`, `observed[name]` lists `observe`, `gauges[name]` is the last `set`."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.observed: dict[str, list[float]] = {}
        self.gauges: dict[str, float] = {}

    def inc(self, name: str, value: float = 1.0, tags: Mapping[str, str] | None = None) -> None:
        key = (name, tuple(sorted((tags or {}).items())))
        self.counts[key] = self.counts.get(key, 0.0) + value

    def observe(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        self.observed.setdefault(name, []).append(value)

    def set(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        self.gauges[name] = value

    def export_zeros(
        self, models: Sequence[str] = (), more: Mapping[str, Iterable[Mapping[str, str]]] | None = None
    ) -> None:
        self.zeroed = (tuple(models), {name: list(labels) for name, labels in (more or {}).items()})

    def count(self, name: str, **tags: str) -> float:
        """The sum of `name`'s counts whose tags include `tags`."""
        wanted = set(tags.items())
        return sum(value for (key, kept), value in self.counts.items() if key == name and wanted <= set(kept))

"""A bounded cache whose work in flight is shared: the ingress's caption cache (`vision.cache`) and
document cache (`documents.cache`) are both this one.

Entries are evicted least-recently-used beyond `max_entries` or `max_bytes` (each entry's size as
the owner counts it). A value being computed right now is shared too: a request that asks for a key
in flight waits for that computation instead of starting its own. The computation runs as a task of
its own, so that the request that started it leaving (refused, cancelled, disconnected) never fails
another's wait; when no request waits for it any more, it is cancelled (`cancel_unwaited`: a
document's reading holds a worker) or left to finish into the cache (a caption: the captioner's
batch is shared, and a retry finds it). Failures reach every waiter and are not cached.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

V = TypeVar("V")

Compute = Callable[[list[int]], Awaitable[list[V]]]


@dataclass
class CacheStats:
    """Keys asked for: found (cached, in flight, or repeated within one call: `hits`) or computed (`misses`)."""

    hits: int = 0
    misses: int = 0


class MetricSink(Protocol):
    """What `SharedCache.export` records through (`monitoring.metrics.Recorder`)."""

    def inc(self, name: str, value: float = 1.0) -> None: ...

    def set(self, name: str, value: float) -> None: ...


class _Flight(Generic[V]):
    """One computation in progress: the keys it computes and how many calls wait for it."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self.waiters = 0
        self.task: asyncio.Task[list[V]] | None = None


class SharedCache(Generic[V]):
    """An LRU cache bounded by entries and bytes whose computations in flight are shared (see the module's
    docstring).
    """

    def __init__(
        self, max_entries: int, max_bytes: int, size: Callable[[str, V], int], *, cancel_unwaited: bool
    ) -> None:
        """`size(key, value)`: an entry's bytes; `cancel_unwaited`: whether a computation nobody
        waits for any more is cancelled (else it finishes, into the cache).
        """
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._size = size
        self._cancel_unwaited = cancel_unwaited
        self._entries: OrderedDict[str, V] = OrderedDict()
        self._inflight: dict[str, tuple[_Flight[V], int]] = {}  # key -> its computation, its place in it
        self.bytes = 0
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def in_flight(self) -> int:
        """Keys being computed now (each shared by every call waiting for it)."""
        return len(self._inflight)

    def peek(self, key: str) -> V | None:
        """The cached value under `key`, or None; not made recent."""
        return self._entries.get(key)

    def get(self, key: str) -> V | None:
        """The cached value under `key` (made the most recent), or None."""
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: str, value: V) -> None:
        size = self._size(key, value)
        if self.max_entries == 0 or size > self.max_bytes:
            return
        if key in self._entries:
            self.bytes -= self._size(key, self._entries.pop(key))
        self._entries[key] = value
        self.bytes += size
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            old_key, old = self._entries.popitem(last=False)
            self.bytes -= self._size(old_key, old)

    async def get_or_compute(
        self, keys: Sequence[str], compute: Compute[V], stats: CacheStats | None = None
    ) -> list[V]:
        """The values of `keys`: cached ones at once, in-flight ones awaited, and the rest from one
        `compute(indices)` task that receives the position of the first occurrence of each missing
        key. `stats` (the caller's own) gets this call's hits and misses, as the cache's `stats` does.
        """
        found: dict[str, V] = {}
        waits: dict[str, tuple[_Flight[V], int]] = {}
        mine: dict[str, int] = {}
        for i, key in enumerate(keys):
            if key in found or key in waits or key in mine:
                continue
            if (value := self.get(key)) is not None:
                found[key] = value
            elif key in self._inflight:
                waits[key] = self._inflight[key]
            else:
                mine[key] = i
        for counts in (self.stats, stats or CacheStats()):
            counts.hits += len(keys) - len(mine)
            counts.misses += len(mine)
        if mine:
            flight: _Flight[V] = _Flight(list(mine))
            flight.task = asyncio.get_running_loop().create_task(self._compute(flight, list(mine.values()), compute))
            flight.task.add_done_callback(_retrieved)
            for n, key in enumerate(mine):
                waits[key] = self._inflight[key] = (flight, n)
        flights = list({id(flight): flight for flight, _ in waits.values()}.values())
        for flight in flights:
            flight.waiters += 1
        try:
            for key, (flight, n) in waits.items():
                assert flight.task is not None
                found[key] = (await asyncio.shield(flight.task))[n]
        finally:
            await self._leave(flights)
        return [found[key] for key in keys]

    async def get_or_make(self, key: str, make: Callable[[], Awaitable[V]], stats: CacheStats | None = None) -> V:
        """The value of one key: cached, in flight (awaited), or `make()` (as `get_or_compute`)."""

        async def compute(_: list[int]) -> list[V]:
            return [await make()]

        return (await self.get_or_compute([key], compute, stats))[0]

    async def _leave(self, flights: list[_Flight[V]]) -> None:
        """A call stops waiting for `flights`; with `cancel_unwaited`, those that nobody waits for any
        more are cancelled (and awaited: stopped before the caller's answer goes out).
        """
        stopped = []
        for flight in flights:
            flight.waiters -= 1
            if flight.waiters == 0 and self._cancel_unwaited and flight.task is not None and not flight.task.done():
                flight.task.cancel()
                self._forget(flight)  # a later call starts a computation of its own
                stopped.append(flight.task)
        if stopped:
            await asyncio.wait(stopped)

    def _forget(self, flight: _Flight[V]) -> None:
        for key in flight.keys:
            if self._inflight.get(key, (None, 0))[0] is flight:
                del self._inflight[key]

    async def _compute(self, flight: _Flight[V], indices: list[int], compute: Compute[V]) -> list[V]:
        try:
            values = await compute(indices)
        finally:
            self._forget(flight)
        for key, value in zip(flight.keys, values, strict=True):
            self.put(key, value)
        return values

    def describe(self) -> dict[str, int]:
        return {
            "entries": len(self._entries),
            "bytes": self.bytes,
            "hits": self.stats.hits,
            "misses": self.stats.misses,
        }

    def export(self, metrics: MetricSink, name: str, stats: CacheStats | None = None) -> None:
        """Record the cache's size as the gauges `<name>_entries` and `<name>_bytes` and, when given,
        a call's `stats` as the counters `<name>_hits` and `<name>_misses`.
        """
        metrics.set(f"{name}_entries", len(self._entries))
        metrics.set(f"{name}_bytes", self.bytes)
        if stats is not None:
            metrics.inc(f"{name}_hits", stats.hits)
            metrics.inc(f"{name}_misses", stats.misses)


def _retrieved(task: asyncio.Task[object]) -> None:
    """A computation's failure is marked retrieved: no warning when every waiter has gone."""
    if not task.cancelled():
        task.exception()

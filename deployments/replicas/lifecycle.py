"""`EngineSlot`: one engine's life in a replica: load, failure with its reason, retry, idle unload.

A replica keeps serving while its engine is missing: callers get the slot's `unavailable` error
with the reason (OOM, missing weights, ...), a background thread retries loading with backoff,
and an idle engine is unloaded after `idle_unload_s` and reloaded by the next request.

Each failed load is one log line with its cause and when the next attempt runs. A failure the
slot's `expected` says is expected (weights not reachable: no hub offline, an empty directory) is
a WARNING without a traceback; any other is an ERROR with its traceback (a real crash).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

import psutil
import ray

from deployments.config import Lifecycle
from deployments.engines import Engine, TextEngine
from deployments.errors import UnavailableError
from deployments.protocol.replica import ComponentStatus

logger = logging.getLogger("ray.serve")

E = TypeVar("E", bound=Engine)

RETRY_MAX_S = 300.0


class EngineSlot(Generic[E]):
    """One engine's life in a replica: load, failure, retry and idle unload (see the module's docstring)."""

    def __init__(
        self,
        role: str,
        name: str,
        factory: Callable[[], E],
        *,
        unavailable: type[UnavailableError],
        lifecycle: Lifecycle,
        sample: Callable[[], None] | None = None,
        expected: Callable[[Exception], bool] = lambda exc: False,
    ) -> None:
        """`sample`: called on every tick of the background thread (the replica's gauges); `expected`:
        whether a load error is an expected condition (logged without its traceback).
        """
        self.role, self.name = role, name
        self._sample = sample
        self._expected = expected
        self.expected_failure = False  # the last load failed for an expected reason (`expected`)
        self.attempts = 0  # failed loads in a row
        self.next_retry_at: datetime | None = None  # wall-clock time of the next load attempt, after a failure
        self._factory = factory
        self._unavailable = unavailable
        self._idle_unload_s = lifecycle.idle_unload_s
        self._retry_first_s = lifecycle.load_retry_s
        self._lock = threading.RLock()
        self.engine: E | None = None
        self.engine_name: str | None = None  # what the engine's `describe` calls itself, for /health
        self.state = "loading"
        self.reason: str | None = "loading"
        # Why the last load failed, kept while a retry runs; None once one succeeds.
        self.error: str | None = None
        self._in_use = 0
        self._last_used = time.monotonic()
        self._retry_in = self._retry_first_s
        self._next_retry = 0.0
        self._stop = threading.Event()

    def load(self) -> bool:
        """Load the engine now (blocking). Never raises: a failure is recorded and logged."""
        with self._lock:
            if self.engine is not None:
                return True
            self.state, self.reason = "loading", "loading"
            try:
                engine = self._factory()
            except Exception as exc:
                self._failed(exc)
                return False
            self.engine, self.state, self.reason, self.error = engine, "ready", None, None
            self.attempts, self.next_retry_at, self.expected_failure = 0, None, False
            self._retry_in = self._retry_first_s
            self._last_used = time.monotonic()
            described = engine.describe()
            self.engine_name = described.get("engine")
            logger.info(describe_line(self.name, self.role, described))
            return True

    def _failed(self, exc: Exception) -> None:
        self.state, self.attempts = "failed", self.attempts + 1
        self.reason = self.error = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]  # one line
        try:
            self.expected_failure = self._expected(exc)
        except Exception:  # telling must never stop the retries: unknown means a real failure, traceback and all
            self.expected_failure = False
        self._next_retry = time.monotonic() + self._retry_in
        self.next_retry_at = datetime.now(UTC) + timedelta(seconds=self._retry_in)
        line = "%s %r cannot load (attempt %d): %s; next attempt in %.0f s, at %s"
        args = (self.role, self.name, self.attempts, self.reason, self._retry_in, utc_text(self.next_retry_at))
        if self.expected_failure:
            logger.warning(line, *args)
        else:
            logger.error(line, *args, exc_info=exc)
        self._retry_in = min(self._retry_in * 2, RETRY_MAX_S)

    def wait_loaded(self, waiting: Callable[[], None], tick_s: float) -> bool:
        """Load now and, while that fails, again at each retry time, blocking: `waiting` is called after
        each failed attempt and every `tick_s` until the next. False if `stop` ended the wait first.
        """
        while not self.load():
            while not self._stop.is_set():
                waiting()
                left = self._next_retry - time.monotonic()
                if left <= 0:
                    break
                self._stop.wait(min(tick_s, left))
            if self._stop.is_set():
                return False
        return True

    def start(self, tick_s: float = 1.0) -> None:
        """Start the background thread that retries failed loads and unloads idle engines."""
        threading.Thread(target=self._maintain, args=(tick_s,), name=f"{self.role}-slot", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _maintain(self, tick_s: float) -> None:
        while not self._stop.wait(tick_s):
            if self._sample is not None:
                try:
                    self._sample()
                except Exception:  # a gauge must never stop the retries and unloads below
                    logger.exception("%s %r: sampling its metrics failed", self.role, self.name)
            now = time.monotonic()
            if self.state == "failed" and now >= self._next_retry:
                self.load()
            elif self._idle_unload_s and self.state == "ready":
                with self._lock:
                    if self._in_use == 0 and now - self._last_used > self._idle_unload_s:
                        self._unload()

    def _unload(self) -> None:
        engine, self.engine = self.engine, None
        self.state, self.reason = "unloaded", None
        if engine is not None:
            engine.close()
        logger.info("%s %r unloaded after %.0fs idle", self.role, self.name, self._idle_unload_s)

    @asynccontextmanager
    async def use(self) -> AsyncIterator[E]:
        """The engine for one request; reloads an idle-unloaded engine, else raises `unavailable`."""
        if self.state == "unloaded":
            await asyncio.to_thread(self.load)
        with self._lock:
            engine = self.engine
            if engine is None:
                raise self._unavailable(f"{self.role} {self.name!r} is not loaded ({self.reason})")
            self._in_use += 1
        try:
            yield engine
        finally:
            with self._lock:
                self._in_use -= 1
                self._last_used = time.monotonic()

    def status(self) -> ComponentStatus:
        details: dict[str, Any] = {
            "state": self.state,
            "in_use": self._in_use,
            "rss_mb": psutil.Process().memory_info().rss // 2**20,
        }
        if ray.is_initialized():  # where Ray pinned this replica, and what the engine runs on
            details["gpu_ids"] = [str(g) for g in ray.get_gpu_ids()]
        if self.engine_name is not None:
            details["engine"] = self.engine_name
        if self.state == "failed" and self.next_retry_at is not None:
            details["attempts"] = self.attempts
            details["next_retry_at"] = utc_text(self.next_retry_at)
        if self.engine is not None:
            if self.engine.device is not None:
                details["device"] = self.engine.device
            if isinstance(self.engine, TextEngine):
                details["batch_invariant"] = self.engine.batch_invariant
            details.update(self.engine.stats())
        return ComponentStatus(
            ready=self.state in ("ready", "unloaded"),
            model=self.name,
            reason=self.reason if self.state not in ("ready", "unloaded") else None,
            details=details,
        )


def utc_text(moment: datetime) -> str:
    """A time as the logs, /health and the ready line write it: ISO 8601 in UTC, to the second."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def describe_line(name: str, role: str, info: dict[str, Any]) -> str:
    """The one readable line logged per engine with its effective settings."""
    items = " ".join(f"{k}={v}" for k, v in info.items())
    return f"engine ready: {role} {name!r} {items}"

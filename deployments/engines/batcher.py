"""Dynamic batching for one model that runs one batch at a time (the captioner).

`submit` queues an item and awaits its result; one worker task runs the batch function on up to
`max_batch_size` queued items at a time. A batch is formed when the model is free: items that
arrive while a batch runs go together in the next one, and a model that was idle waits at most
`wait_s` after the first item for others to join it.

Ray Serve's `serve.batch` (Ray 2.60) forms batches before the running one ends: each arrival waits
`batch_wait_timeout_s`, becomes a batch of whatever came in that time, and queues for the model,
so a busy model gets batches of one or two.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Batcher(Generic[T, R]):
    """Runs the items submitted to one model in batches, one batch at a time (see the module's docstring)."""

    def __init__(self, run: Callable[[list[T]], Awaitable[list[R]]], max_batch_size: int, wait_s: float) -> None:
        self._run = run
        self.max_batch_size = max_batch_size
        self.wait_s = wait_s
        self._queue: deque[tuple[T, asyncio.Future[R]]] = deque()
        self._arrived = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
            # A worker of another (closed) event loop would never run this item, and its Event is bound there.
            self._arrived = asyncio.Event()
            self._worker = loop.create_task(self._work())
        future: asyncio.Future[R] = loop.create_future()
        self._queue.append((item, future))
        self._arrived.set()
        return await future  # a cancelled caller's item is dropped before its batch runs

    async def _work(self) -> None:
        while True:
            if not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
                await self._fill()
            batch = [self._queue.popleft() for _ in range(min(len(self._queue), self.max_batch_size))]
            batch = [(item, future) for item, future in batch if not future.done()]
            if batch:
                await self._run_batch(batch)

    async def _fill(self) -> None:
        """The model was idle: wait up to `wait_s` for a full batch."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        while len(self._queue) < self.max_batch_size and (left := deadline - loop.time()) > 0:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), left)

    async def _run_batch(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._run([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"a batch of {len(batch)} items returned {len(results)} results")
        except Exception as exc:  # every caller in the batch gets the error; the worker goes on
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

"""When a request may enter: budgets that requests hold a share of, granted by priority (vLLM's
`priority`: lower first), in arrival order among equal priorities.

The decoder replica's `max_num_seqs` sequences are one (`replicas/decoder.py`: a unit each); llama.cpp's
engine has two more:

- **Room in a KV pool that the slots share** (cells). llama.cpp's unified KV cache has no
  preemption: when the running sequences outgrow the pool, a decode step finds no free cells and
  llama.cpp fails every sequence of the batch ("Context size has been exceeded"). So each request
  reserves its prompt's cells plus its completion budget before it starts, and holds them until its
  stream ends. A request alone always fits: the pool holds at least `max_model_len` cells
  (`engine.kv_layout`). Slots with a stream of their own never wait for it.
- **Prompt tokens in prefill** (tokens, llama.cpp's `n_batch` by default). llama.cpp spreads each
  step's prompt tokens over every slot that is still in its prompt, so a burst of long prompts
  reaches its first tokens together, all late (16 prompts of 1,200 tokens on 2 cores: none before
  about 250 s, past most deadlines). Like vLLM's first-come-first-served chunked prefill, a
  request's prompt enters while the prompts still in prefill leave it room, and leaves the budget
  at its first token: the first requests answer first, and short prompts pass beside a long one.
  Decoding sequences are not held back; the work done is the same.

Either way a request that does not fit waits, by priority then in arrival order (a large request is
not starved by small ones of its priority behind it), until enough is released; one larger than
the budget is held to the budget (it runs alone). Waiting is cancellable: a request whose client
leaves or whose deadline passes stops waiting at once.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass
class _Waiter:
    need: int
    future: asyncio.Future[None]
    order: tuple[int, int] = (0, 0)  # (priority, arrival): the queue's order
    granted: bool = field(default=False)


class Budget:
    """`size` units shared by every request; `reserve(need)` holds `need` of them for a block, or
    until the block calls the release it was given."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.reserved = 0
        self._queue: list[_Waiter] = []  # sorted by (priority, arrival)
        self._arrivals = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @asynccontextmanager
    async def reserve(self, need: int, priority: int = 0) -> AsyncIterator[Callable[[], None]]:
        """`need` units held for the block; `priority`: lower is granted first."""
        need = min(need, self.size)
        order = (priority, next(self._arrivals))
        if (self._queue and self._queue[0].order < order) or self.reserved + need > self.size:
            waiter = _Waiter(need, asyncio.get_running_loop().create_future(), order)
            bisect.insort(self._queue, waiter, key=lambda w: w.order)
            try:
                await waiter.future
            except BaseException:
                if waiter.granted:  # granted as it was cancelled: give the units back
                    self._release(need)
                else:
                    self._queue.remove(waiter)
                    self._grant()  # the ones behind it may fit now
                raise
        else:
            self.reserved += need
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self._release(need)

        try:
            yield release
        finally:
            release()

    def _release(self, need: int) -> None:
        self.reserved -= need
        self._grant()

    def _grant(self) -> None:
        while self._queue and self.reserved + self._queue[0].need <= self.size:
            waiter = self._queue.pop(0)
            waiter.granted = True
            self.reserved += waiter.need
            if not waiter.future.done():
                waiter.future.set_result(None)

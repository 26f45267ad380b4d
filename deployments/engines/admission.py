"""When a request may enter: budgets that requests hold a share of, granted by priority (vLLM's
`priority`: lower first), in arrival order among equal priorities.

The decoder replica's `max_num_seqs` sequences are one (`Sequences`, a unit each, which also keeps
background work such as batch lines to the replica's idle capacity); llama.cpp's engine has two more:

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

from deployments.protocol.replica import BACKGROUND_PRIORITY


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
        if (
            (self._queue and self._queue[0].order < order)
            or self.reserved + need > self.size
            or not self._admits(priority)
        ):
            waiter = _Waiter(need, asyncio.get_running_loop().create_future(), order)
            bisect.insort(self._queue, waiter, key=lambda w: w.order)
            try:
                await waiter.future
            except BaseException:
                if waiter.granted:  # granted as it was cancelled: give the units back
                    self._release(need, priority)
                else:
                    self._queue.remove(waiter)
                    self._grant()  # the ones behind it may fit now
                raise
        else:
            self._take(need, priority)
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self._release(need, priority)

        try:
            yield release
        finally:
            release()

    def _admits(self, priority: int) -> bool:
        """Whether a request of `priority` may be granted now, room aside (always, here)."""
        return True

    def _take(self, need: int, priority: int) -> None:
        self.reserved += need

    def _release(self, need: int, priority: int) -> None:
        self.reserved -= need
        self._grant()

    def _grant(self) -> None:
        """Grant the waiters at the queue's head while they fit (and are admitted: the queue is in
        priority order, so the ones behind a refused priority are refused too)."""
        while (
            self._queue and self.reserved + self._queue[0].need <= self.size and self._admits(self._queue[0].order[0])
        ):
            waiter = self._queue.pop(0)
            waiter.granted = True
            self._take(waiter.need, waiter.order[0])
            if not waiter.future.done():
                waiter.future.set_result(None)


class Sequences(Budget):
    """A decoder replica's `max_num_seqs` sequences (a unit each), with background work on idle
    capacity. Background work is a request of `BACKGROUND_PRIORITY` or later (every batch line).
    Priority alone orders only the requests that wait for a sequence; on a CPU every running
    sequence slows each step. So while a foreground request is on the replica (waiting or running),
    or was within the last `quiet_s`, at most `busy_share` background sequences run (none by
    default: one beside a chat made its time to first token 1.8x on 2 cores) and the others wait,
    later priorities after earlier ones; once the replica has been quiet for `quiet_s` they may all
    start. Background sequences already running when a foreground request arrives finish as they
    are (nothing is preempted)."""

    def __init__(self, size: int, quiet_s: float = 1.0, busy_share: int = 0) -> None:
        super().__init__(size)
        self.quiet_s = quiet_s
        self.busy_share = busy_share
        self.foreground = 0  # foreground requests on the replica, waiting or running
        self.background = 0  # background sequences granted
        self._quiet_since = -float("inf")  # when the last foreground request left (the loop's clock)

    @asynccontextmanager
    async def reserve(self, need: int, priority: int = 0) -> AsyncIterator[Callable[[], None]]:
        if priority >= BACKGROUND_PRIORITY:
            async with super().reserve(need, priority) as release:
                yield release
            return
        self.foreground += 1
        try:
            async with super().reserve(need, priority) as release:
                yield release
        finally:
            self.foreground -= 1
            if not self.foreground:
                self._quiet_since = asyncio.get_running_loop().time()
                self._when_quiet()

    def _when_quiet(self) -> None:
        """Grant the background waiters once the replica has been quiet for `quiet_s` (a timer's
        callback may run a little early: then again, later)."""
        if self.foreground:
            return  # the last foreground request to leave sets the next timer
        left = self._quiet_since + self.quiet_s - asyncio.get_running_loop().time()
        if left > 0:
            asyncio.get_running_loop().call_later(left, self._when_quiet)
        else:
            self._grant()

    def _admits(self, priority: int) -> bool:
        if priority < BACKGROUND_PRIORITY or self.background < self.busy_share:
            return True
        quiet_for = asyncio.get_running_loop().time() - self._quiet_since
        return not self.foreground and quiet_for >= self.quiet_s

    def _take(self, need: int, priority: int) -> None:
        super()._take(need, priority)
        if priority >= BACKGROUND_PRIORITY:
            self.background += need

    def _release(self, need: int, priority: int) -> None:
        if priority >= BACKGROUND_PRIORITY:
            self.background -= need
        super()._release(need, priority)

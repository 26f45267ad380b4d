"""Room in a KV pool that the slots share: a request waits until the cells it may need are free.

llama.cpp's unified KV cache has no preemption: when the running sequences outgrow the pool, a
decode step finds no free cells and llama.cpp fails every sequence of the batch ("Context size has
been exceeded"). So each request reserves its prompt's cells plus its completion budget before it
starts, and releases them when its stream ends; one that does not fit waits, in arrival order (a
large request is not starved by small ones behind it), until enough is released. A request alone
always fits: the pool holds at least `max_model_len` cells (`engine.kv_layout`). Waiting is
cancellable: a request whose client leaves or whose deadline passes stops waiting at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass
class _Waiter:
    need: int
    future: asyncio.Future[None]
    granted: bool = field(default=False)


class KvRoom:
    """`cells` shared by every request; `reserve(need)` holds `need` of them for a block."""

    def __init__(self, cells: int) -> None:
        self.cells = cells
        self.reserved = 0
        self._queue: deque[_Waiter] = deque()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @asynccontextmanager
    async def reserve(self, need: int) -> AsyncIterator[None]:
        need = min(need, self.cells)
        if self._queue or self.reserved + need > self.cells:
            waiter = _Waiter(need, asyncio.get_running_loop().create_future())
            self._queue.append(waiter)
            try:
                await waiter.future
            except BaseException:
                if waiter.granted:  # granted as it was cancelled: give the cells back
                    self._release(need)
                else:
                    self._queue.remove(waiter)
                    self._grant()  # the ones behind it may fit now
                raise
        else:
            self.reserved += need
        try:
            yield
        finally:
            self._release(need)

    def _release(self, need: int) -> None:
        self.reserved -= need
        self._grant()

    def _grant(self) -> None:
        while self._queue and self.reserved + self._queue[0].need <= self.cells:
            waiter = self._queue.popleft()
            waiter.granted = True
            self.reserved += waiter.need
            if not waiter.future.done():
                waiter.future.set_result(None)

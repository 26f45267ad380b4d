"""Several async streams read as one, item by item as they come: a request's `n` sequences in the
decoder replica, a legacy completion's prompts in the ingress.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Generic, TypeVar

T = TypeVar("T")
_DONE = object()


class MergedStreams(Generic[T]):
    """Iterate for the items of every stream as they come. An error in one stream ends them all: it
    is raised to the reader and the others are cancelled. `cancel()` stops every stream at once, and
    each is closed, so that what it holds (a sequence's slot) is freed; `aclose()` also waits for that.
    """

    def __init__(self, streams: Sequence[AsyncGenerator[T, None]]) -> None:
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._running = len(streams)
        self._tasks = [asyncio.ensure_future(self._pump(stream)) for stream in streams]

    async def _pump(self, stream: AsyncGenerator[T, None]) -> None:
        try:
            async with aclosing(stream):
                async for item in stream:
                    await self._queue.put(item)
        except Exception as exc:
            await self._queue.put(exc)
        finally:
            self._queue.put_nowait(_DONE)

    def __aiter__(self) -> MergedStreams[T]:
        return self

    async def __anext__(self) -> T:
        while self._running:
            item = await self._queue.get()
            if item is _DONE:
                self._running -= 1
            elif isinstance(item, BaseException):
                self.cancel()
                raise item
            else:
                return item  # type: ignore[return-value]
        raise StopAsyncIteration

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()

    async def aclose(self) -> None:
        """`cancel()`, and wait until every stream is closed."""
        self.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

"""`ThreadStream`: items that a worker thread produces, awaited on the event loop, the one bridge
every engine whose work blocks uses (a `model.generate` thread, a batch's thread, llama.cpp's
streamed completion).

The producer (any thread) calls `send` for each item, `fail` with an exception, and `end` (or hands
its whole body to `run`, which does all three); it checks `cancelled` between items. The consumer
(the event loop that made the stream) iterates it inside ``with stream:``: items arrive in order,
a failure is raised (through `error`, the engine's mapping) after the items sent before it, and
leaving the block (the consumer's generator closed: a stop string, the client gone) sets `cancelled`,
which the producer sees before its next item. Items sent once the event loop is gone are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)

_END = object()


class _Failed:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Sink(Protocol[T_contra]):
    """The producer's side of a stream: what a worker thread that a `ThreadStream` does not start
    (a batch's thread) is handed.
    """

    def send(self, item: T_contra) -> None: ...

    def fail(self, error: BaseException) -> None: ...

    def end(self) -> None: ...


class ThreadStream(Generic[T]):
    """Made on the event loop that consumes it; `error` maps the producer's exception to the one the
    consumer raises (by default, the exception itself).
    """

    def __init__(self, error: Callable[[BaseException], BaseException] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._error = error
        self._ended = False
        self.cancelled = threading.Event()
        """Set once the consumer stopped reading: the producer should stop."""

    # ------------------------------------------------------------------ the producer's side (any thread)

    def send(self, item: T) -> None:
        self._put(item)

    def fail(self, error: BaseException) -> None:
        """The consumer raises `error` (mapped) after the items sent before it."""
        self._put(_Failed(error))

    def end(self) -> None:
        """No more items: the consumer's iteration stops."""
        self._put(_END)

    def run(self, produce: Callable[[], None]) -> None:
        """`produce()` as a worker thread's body: its exception is sent, then the end, so that the
        consumer never waits on a dead thread.
        """
        try:
            produce()
        except BaseException as exc:  # surfaces in the request, not in a dead thread
            self.fail(exc)
        finally:
            self.end()

    def _put(self, item: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone (shutdown): nobody listens any more
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    # ------------------------------------------------------------------ the consumer's side (the loop)

    def __aiter__(self) -> ThreadStream[T]:
        return self

    async def __anext__(self) -> T:
        if self._ended:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is _END:
            self._ended = True
            raise StopAsyncIteration
        if isinstance(item, _Failed):
            raise item.error if self._error is None else self._error(item.error)
        return item  # type: ignore[return-value]

    def cancel(self) -> None:
        """Stop the producer: it sees `cancelled` before its next item."""
        self.cancelled.set()

    def __enter__(self) -> ThreadStream[T]:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.cancel()

"""Caption cache of an ingress replica: the same image with the same prompt is captioned once.

Keys are a SHA-256 of the image bytes, the captioner's name and the rendered caption prompt (the
template with the user's text filled in), so one picture sent as a URL and as a data URL is the
same entry, and changing the captioner or its template never serves a stale caption. Entries are
evicted least-recently-used beyond `max_entries` or `max_bytes` (captions and keys). Images that
are being captioned right now are shared too: a second request for the same key waits for the
first one's caption instead of sending the image again.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

_ENTRY_OVERHEAD = 200  # bytes per entry beyond its strings: the dict slot and the str objects


def cache_key(image_digest: str, captioner: str, prompt: str) -> str:
    return hashlib.sha256(f"{image_digest}\0{captioner}\0{prompt}".encode()).hexdigest()


def image_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0


class CaptionCache:
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[str, str] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[str]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.bytes = 0
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _size(key: str, caption: str) -> int:
        return len(key) + len(caption.encode()) + _ENTRY_OVERHEAD

    def get(self, key: str) -> str | None:
        caption = self._entries.get(key)
        if caption is not None:
            self._entries.move_to_end(key)
        return caption

    def put(self, key: str, caption: str) -> None:
        size = self._size(key, caption)
        if self.max_entries == 0 or size > self.max_bytes:
            return
        if key in self._entries:
            self.bytes -= self._size(key, self._entries.pop(key))
        self._entries[key] = caption
        self.bytes += size
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            old_key, old_caption = self._entries.popitem(last=False)
            self.bytes -= self._size(old_key, old_caption)

    async def get_or_compute(
        self,
        keys: Sequence[str],
        compute: Callable[[list[int]], Awaitable[list[str]]],
        stats: CacheStats | None = None,
    ) -> list[str]:
        """Captions for `keys`: cached ones at once, in-flight ones awaited, and the rest from one
        `compute(indices)` call that receives the position of the first occurrence of each missing key.
        `stats` (the caller's own) gets this call's hits and misses, as the cache's `stats` does.

        `compute` runs as its own task: a caller that goes away does not cancel a caption that other
        requests wait for (and that the cache will keep)."""
        loop = asyncio.get_running_loop()
        found: dict[str, str] = {}
        pending: dict[str, asyncio.Future[str]] = {}
        mine: dict[str, int] = {}
        for i, key in enumerate(keys):
            if key in found or key in pending:
                continue
            if (caption := self.get(key)) is not None:
                found[key] = caption
            elif key in self._inflight:
                pending[key] = self._inflight[key]
            else:
                mine[key] = i
                pending[key] = self._inflight[key] = loop.create_future()
        for counts in (self.stats, stats or CacheStats()):
            counts.hits += len(keys) - len(mine)
            counts.misses += len(mine)
        if mine:
            task = loop.create_task(self._compute(mine, compute))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        for key, future in pending.items():
            found[key] = await asyncio.shield(future)
        return [found[key] for key in keys]

    async def _compute(self, mine: dict[str, int], compute: Callable[[list[int]], Awaitable[list[str]]]) -> None:
        try:
            captions = await compute(list(mine.values()))
        except BaseException as exc:
            for key in mine:
                future = self._inflight.pop(key)
                if isinstance(exc, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(exc)
                    future.exception()  # marked retrieved: no warning when every waiter has gone
            if not isinstance(exc, Exception):
                raise
            return
        for key, caption in zip(mine, captions, strict=True):
            self.put(key, caption)
            self._inflight.pop(key).set_result(caption)

    def describe(self) -> dict[str, int]:
        return {
            "entries": len(self._entries),
            "bytes": self.bytes,
            "hits": self.stats.hits,
            "misses": self.stats.misses,
        }

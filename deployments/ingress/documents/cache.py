"""The document cache of an ingress replica: a document is read once, however often it is sent.

An agent resends the same PDF on every turn of a conversation (it is part of the history), so the
reading, not the sending, is what a cache saves. Entries are keyed by the SHA-256 of the bytes and
the document's kind, so the same PDF sent as `file_data`, as a /v1/files upload and by URL is one
entry; the settings that shape a reading are fixed per replica. Entries are evicted
least-recently-used beyond `documents.cache_entries` or `documents.cache_mb`. A document being read
right now is shared too: a second request for it waits for the first reading, which runs as a task
of its own, so that one request leaving (refused, cancelled, disconnected) never fails another's
read; the reading is cancelled only when the last request waiting for it has left. Failures are
not cached (a timeout may pass on a quieter machine)."""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from deployments.ingress.documents.reader import ReadDocument


def document_key(data: bytes, kind: str) -> str:
    return f"{kind}:{hashlib.sha256(data).hexdigest()}"


@dataclass
class DocumentCacheStats:
    hits: int = 0
    misses: int = 0


class _Flight:
    """A reading in progress and how many requests wait for it."""

    def __init__(self, task: asyncio.Task[ReadDocument]) -> None:
        self.task = task
        self.waiters = 0


class DocumentCache:
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[str, ReadDocument] = OrderedDict()
        self._inflight: dict[str, _Flight] = {}
        self.bytes = 0
        self.stats = DocumentCacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def reading(self) -> int:
        """Readings in progress (each shared by every request waiting for it)."""
        return len(self._inflight)

    def put(self, key: str, document: ReadDocument) -> None:
        if self.max_entries == 0 or document.size > self.max_bytes:
            return
        if key in self._entries:
            self.bytes -= self._entries.pop(key).size
        self._entries[key] = document
        self.bytes += document.size
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.size

    def peek(self, key: str) -> ReadDocument | None:
        """The cached document under `key`, or None; neither counted nor made recent."""
        return self._entries.get(key)

    def get(self, key: str) -> ReadDocument | None:
        """The cached document under `key` (counted as a hit), or None."""
        if (found := self._entries.get(key)) is not None:
            self._entries.move_to_end(key)
            self.stats.hits += 1
        return found

    async def get_or_read(self, key: str, read: Callable[[], Awaitable[ReadDocument]]) -> ReadDocument:
        """The document under `key`: cached, being read for another request (awaited), or `read()`.

        `read()` runs as a task of its own, shared by every request that asks for `key` while it
        runs: a waiter that leaves (cancelled) leaves the others waiting, and the task is cancelled
        only when no request waits for it any more (its worker then stops: `reader`)."""
        if (found := self.get(key)) is not None:
            return found
        flight = self._inflight.get(key)
        if flight is None:
            self.stats.misses += 1
            flight = self._inflight[key] = _Flight(asyncio.get_running_loop().create_task(self._read(key, read)))
        else:
            self.stats.hits += 1
        flight.waiters += 1
        try:
            return await asyncio.shield(flight.task)
        finally:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.task.done():
                flight.task.cancel()  # nobody waits: its PDF is never read (or its worker stops)
                if self._inflight.get(key) is flight:
                    del self._inflight[key]  # a later request starts a reading of its own
                await asyncio.wait({flight.task})  # stopped before the request's answer goes out

    async def _read(self, key: str, read: Callable[[], Awaitable[ReadDocument]]) -> ReadDocument:
        try:
            document = await read()
        finally:
            flight = self._inflight.get(key)
            if flight is not None and flight.task is asyncio.current_task():
                del self._inflight[key]
        self.put(key, document)
        return document

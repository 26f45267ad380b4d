"""The document cache of an ingress replica: a document is read once, however often it is sent.

An agent resends the same PDF on every turn of a conversation (it is part of the history), so the
reading, not the sending, is what a cache saves. Entries are keyed by the SHA-256 of the bytes and
the document's kind, so the same PDF sent as `file_data`, as a /v1/files upload and by URL is one
entry; the settings that shape a reading are fixed per replica. Entries are evicted
least-recently-used beyond `documents.cache_entries` or `documents.cache_mb`. A document being read
right now is shared too: a second request for it waits for the first reading. Failures are not
cached (a timeout may pass on a quieter machine)."""

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


class DocumentCache:
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[str, ReadDocument] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[ReadDocument]] = {}
        self.bytes = 0
        self.stats = DocumentCacheStats()

    def __len__(self) -> int:
        return len(self._entries)

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

    async def get_or_read(self, key: str, read: Callable[[], Awaitable[ReadDocument]]) -> ReadDocument:
        """The document under `key`: cached, being read by another request (awaited), or `read()`."""
        if (found := self._entries.get(key)) is not None:
            self._entries.move_to_end(key)
            self.stats.hits += 1
            return found
        if (pending := self._inflight.get(key)) is not None:
            self.stats.hits += 1
            return await asyncio.shield(pending)
        self.stats.misses += 1
        future: asyncio.Future[ReadDocument] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            document = await read()
        except BaseException as exc:
            if isinstance(exc, Exception):
                future.set_exception(exc)
                future.exception()  # retrieved: no warning when nobody else waited
            else:
                future.cancel()
            raise
        finally:
            self._inflight.pop(key, None)
        self.put(key, document)
        future.set_result(document)
        return document

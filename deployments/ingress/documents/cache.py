"""The document cache of an ingress replica: a document is read once, however often it is sent.

An agent resends the same PDF on every turn of a conversation (it is part of the history), so the
reading, not the sending, is what a cache saves. Entries are keyed by the SHA-256 of the bytes and
the document's kind, so the same PDF sent as `file_data`, as a /v1/files upload and by URL is one
entry; the settings that shape a reading are fixed per replica. Bounded by `documents.cache_entries`
and `documents.cache_mb`; a document being read is shared by every request that sends it, and its
reading is cancelled when the last of them has left (refused, cancelled, disconnected: its worker
stops, `reader`), never before (`media.cache.SharedCache`). Failures are not cached (a timeout may
pass on a quieter machine).
"""

from __future__ import annotations

import hashlib

from deployments.ingress.documents.reader import ReadDocument
from deployments.ingress.media.cache import SharedCache


def document_key(data: bytes, kind: str) -> str:
    """A document's cache key: its kind and its bytes' SHA-256."""
    return f"{kind}:{hashlib.sha256(data).hexdigest()}"


def _size(key: str, document: ReadDocument) -> int:
    return document.size


class DocumentCache(SharedCache[ReadDocument]):
    """The documents read, by `document_key`; a reading nobody waits for any more is cancelled."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        super().__init__(max_entries, max_bytes, _size, cancel_unwaited=True)

"""Caption cache of an ingress replica: the same image with the same prompt is captioned once.

Keys are a SHA-256 of the image bytes, the captioner's name and the rendered caption prompt (the
template with the user's text filled in), so one picture sent as a URL, as a data URL or as a
document's page is the same entry, and changing the captioner or its template never serves a stale
caption. Bounded in entries and bytes (captions and keys); images being captioned right now are
shared (`media.cache.SharedCache`); a caption that nobody waits for any more is still finished and
kept.
"""

from __future__ import annotations

import hashlib

from deployments.ingress.media.cache import SharedCache

_ENTRY_OVERHEAD = 200  # bytes per entry beyond its strings: the dict slot and the str objects


def cache_key(image_digest: str, captioner: str, prompt: str) -> str:
    """A caption's cache key: the image's digest, the captioner and the prompt, hashed together."""
    return hashlib.sha256(f"{image_digest}\0{captioner}\0{prompt}".encode()).hexdigest()


def image_digest(data: bytes) -> str:
    """The SHA-256 of an image's bytes, as caption keys take it."""
    return hashlib.sha256(data).hexdigest()


def _size(key: str, caption: str) -> int:
    return len(key) + len(caption.encode()) + _ENTRY_OVERHEAD


class CaptionCache(SharedCache[str]):
    """The captions made, by `cache_key`; a caption nobody waits for any more still finishes into the cache."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        super().__init__(max_entries, max_bytes, _size, cancel_unwaited=False)

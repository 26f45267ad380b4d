"""Processed images kept per replica (vLLM's processor cache): what a VLM's processor made of an
image, keyed by the SHA-256 of its bytes, so that an image repeated in a later turn or request is
not decoded and processed again. Bounded in bytes, least recently used first out; hits and misses
are counted (the engine's `stats`, on /health and as metrics).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ProcessedImage:
    """One image as the processor made it: `tokens`, the placeholder's expansion (the ids that stand for
    the image in the prompt); `aligned`, the processor's other per-token outputs over those ids (e.g.
    Qwen2-VL's `mm_token_type_ids`); `tensors`, the model's image inputs (`pixel_values`, and
    `image_sizes` or `image_grid_thw` where the model has them), first dimension per image or patch.
    """

    tokens: tuple[int, ...]
    aligned: dict[str, tuple[int, ...]]
    tensors: dict[str, torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values()) + 8 * len(self.tokens)


class ProcessorCache:
    """Processed images by the SHA-256 of their bytes, at most `max_bytes`, least recently used out first."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, ProcessedImage] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, digest: str) -> ProcessedImage | None:
        """The cached entry (counted as a hit), or None (counted as a miss)."""
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(digest)
            self.hits += 1
            return entry

    def put(self, digest: str, entry: ProcessedImage) -> None:
        """Keep `entry`, evicting the least recently used ones; one larger than the bound is not kept."""
        size = entry.nbytes
        with self._lock:
            if size > self.max_bytes or digest in self._entries:
                return
            self._entries[digest] = entry
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                self.bytes -= old.nbytes

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {
                "entries": len(self._entries),
                "bytes": self.bytes,
                "max_bytes": self.max_bytes,
                "hits": self.hits,
                "misses": self.misses,
            }

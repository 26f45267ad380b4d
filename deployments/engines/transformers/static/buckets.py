"""The shapes a static decoder runs at: batch buckets for decode steps, token buckets for prefill
chunks and window buckets for the KV positions a decode step attends over. Every step is padded up
to its bucket, so that a GPU replica captures one CUDA graph per (batch, window) bucket at start and
never captures on a live request.
"""

from __future__ import annotations

import bisect

MIN_WINDOW = 128  # the smallest KV window a decode step attends over
MIN_CHUNK = 16  # the smallest prefill chunk


def powers_up_to(limit: int, start: int = 1) -> tuple[int, ...]:
    """start, 2 start, 4 start, ... below `limit`, then `limit` itself (1, 2, 4, 8, 12 for 12)."""
    sizes: list[int] = []
    size = start
    while size < limit:
        sizes.append(size)
        size *= 2
    sizes.append(limit)
    return tuple(sizes)


def batch_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """Decode batch sizes: 1, 2, 4, 8, 16, 32, ... up to `max_num_seqs` (vLLM's rule for small batches)."""
    return powers_up_to(max_num_seqs)


def window_buckets(max_len: int) -> tuple[int, ...]:
    """KV windows: 128, 256, 512, ... up to `max_len` (the slot's length)."""
    return powers_up_to(max_len, min(MIN_WINDOW, max_len))


def chunk_buckets(chunk_tokens: int) -> tuple[int, ...]:
    """Prefill chunk lengths: 16, 32, 64, ... up to `chunk_tokens`."""
    return powers_up_to(chunk_tokens, min(MIN_CHUNK, chunk_tokens))


def bucket(buckets: tuple[int, ...], size: int) -> int:
    """The smallest bucket that holds `size` (ValueError past the largest)."""
    i = bisect.bisect_left(buckets, size)
    if i == len(buckets):
        raise ValueError(f"{size} is past the largest bucket, {buckets[-1]}")
    return buckets[i]

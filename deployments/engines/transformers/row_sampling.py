"""What a continuous batch's sampler keeps per sequence besides its constraints: its own random
generator (a request's `seed`) and its penalty counts (`frequency_penalty`, `presence_penalty`),
and the registry in which the sampling thread finds them by request id.

- A seeded row draws from its own `torch.Generator`, seeded with the request's seed: one uniform
  number per step, taken through the inverse of its own warped distribution's cumulative sum. Its
  tokens thus depend on its own logits and seed only, not on the other rows or on how many draws
  they took: the same seed and request give the same answer whatever else runs in the batch, as far
  as the model computes the row's logits the same way in any batch (float32 on a CPU does; bfloat16
  and int4 kernels may round differently with the batch's shape: docs/tools.md has the measure).
- A penalized row gets OpenAI's penalties over its completion tokens so far, counted here as the
  sampler chooses them (`sampling.penalize`'s formula).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

T = TypeVar("T")


@dataclass
class RowSampling:
    """One sequence's generator and penalties. Only the sampling thread touches it once it runs."""

    generator: torch.Generator | None = None
    frequency: float = 0.0
    presence: float = 0.0
    counts: torch.Tensor | None = None  # how often each token was chosen so far (penalties only)

    @classmethod
    def of(cls, seed: int | None, frequency: float, presence: float) -> RowSampling | None:
        """None when the sequence needs neither (the sampler's fast path)."""
        if seed is None and not frequency and not presence:
            return None
        generator = None if seed is None else torch.Generator().manual_seed(seed % 2**63)
        return cls(generator, frequency, presence)

    @property
    def penalized(self) -> bool:
        return bool(self.frequency or self.presence)

    def penalize(self, row: torch.Tensor) -> None:
        """Applies the penalties to one row of logits, in place."""
        if not self.penalized:
            return
        if self.counts is None:
            self.counts = torch.zeros(row.size(-1), dtype=torch.float32, device=row.device)
        penalty = self.frequency * self.counts + self.presence * (self.counts > 0).float()
        row.sub_(penalty.to(row.dtype))

    def chose(self, token: int) -> None:
        if self.counts is not None:
            self.counts[token] += 1


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """A token drawn from one row's probabilities with `generator`: one uniform number, the inverse
    cumulative distribution (in float64, so tokens of probability 0 are never drawn)."""
    cumulative = probs.detach().to("cpu", torch.float64).cumsum(0)
    u = torch.rand((), generator=generator, dtype=torch.float64) * cumulative[-1]
    return int(torch.searchsorted(cumulative, u.reshape(1), right=True).clamp(max=probs.numel() - 1))


class RequestRegistry(Generic[T]):
    """Request id -> what its rows need, between the request's stream (registers before the sequence
    is added, removes in its `finally`) and the sampling thread (looks rows up at every step)."""

    def __init__(self) -> None:
        self._entries: dict[str, T] = {}
        self._lock = threading.Lock()

    def add(self, request_id: str, entry: T) -> None:
        with self._lock:
            self._entries[request_id] = entry

    def remove(self, request_id: str) -> None:
        with self._lock:
            self._entries.pop(request_id, None)

    def lookup(self, request_ids: Sequence[str]) -> list[T | None]:
        with self._lock:
            if not self._entries:
                return [None] * len(request_ids)
            return [self._entries.get(r) for r in request_ids]

"""Per-request sampling that every transformers decoder applies the same way: the request's knobs
resolved against the model's defaults, OpenAI's additive penalties and the temperature, top-k,
top-p and min-p warp of one row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampling:
    """A request's sampling settings resolved against the model's defaults; temperature 0 is greedy."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def penalize(
    scores: torch.Tensor, generated: torch.Tensor, frequency: float | torch.Tensor, presence: float | torch.Tensor
) -> torch.Tensor:
    """OpenAI's presence and frequency penalties over each row's completion tokens so far
    (`generated`: one row of token ids per score row); a tensor penalty holds one value per row.
    """
    if generated.shape[1] == 0:
        return scores
    counts = torch.zeros_like(scores).scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
    return scores - frequency * counts - presence * (counts > 0).to(scores.dtype)


def warp(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """One row's logits after temperature, top-k and top-p (tokens left out are -inf)."""
    logits = logits / sampling.temperature
    if sampling.top_k and sampling.top_k < logits.numel():
        kth = torch.topk(logits, sampling.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative - ordered.softmax(-1) > sampling.top_p  # keep the token that crosses top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    if sampling.min_p > 0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < sampling.min_p * probs.max(), float("-inf"))
    return logits

"""What every embedding engine's replica does alike around `EmbedEngine.embed`: an input's token ids
checked against the model (ids in its vocabulary, its length within `max_input_tokens`: cut or a 400
context_length_exceeded with the numbers), and a vector cut to the `dimensions` a request asks for
(Matryoshka truncation, normalised again). Pure functions, tested without a model.
"""

from __future__ import annotations

import math

from deployments.config import EmbeddingConfig
from deployments.errors import ContextLengthError, InvalidRequestError


def fit_input(ids: list[int], index: int, *, limit: int, vocab_size: int, overflow: str) -> list[int]:
    """`ids` (input `index` of the request) ready for `embed`: out-of-vocabulary ids and, under
    `overflow: error`, more than `limit` tokens are 400s; under `truncate` the first `limit` are kept.
    """
    if not ids:
        raise InvalidRequestError(f"input[{index}] is empty: an embedding needs at least one token.", param="input")
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequestError(
            f"input[{index}] has token id {bad}, outside this model's vocabulary (0 to {vocab_size - 1}).",
            param="input",
        )
    if len(ids) <= limit:
        return ids
    if overflow == "truncate":
        return ids[:limit]
    raise ContextLengthError(
        f"input[{index}] has {len(ids)} tokens; this model embeds at most {limit} tokens per input "
        "(embedding.max_input_tokens). Shorten it, or set embedding.overflow: truncate.",
        param="input",
    )


def check_dimensions(requested: int | None, full: int, config: EmbeddingConfig) -> int:
    """The vector size a request gets: the model's own, or a size its entry lists (else a 400)."""
    if requested is None or requested == full:
        return full
    if requested in config.dimensions and requested < full:
        return requested
    allowed = sorted({*(d for d in config.dimensions if d < full), full})
    raise InvalidRequestError(
        f"dimensions {requested} is not supported by this model; it supports {', '.join(map(str, allowed))} "
        "(embedding.dimensions in models.yaml lists the Matryoshka sizes it was trained for).",
        param="dimensions",
    )


def shorten(vector: list[float], size: int, normalize: bool) -> list[float]:
    """The first `size` values, scaled again to unit length when the model's vectors are normalised."""
    if size >= len(vector):
        return vector
    cut = vector[:size]
    if not normalize:
        return cut
    norm = math.sqrt(sum(v * v for v in cut))
    return [v / norm for v in cut] if norm > 0 else cut

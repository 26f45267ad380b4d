"""Token ids that a request names (a legacy prompt's, /detokenize's), checked against the model's
vocabulary before any tokenizer sees them: an id outside it is the request's 400, never a crash
(llama.cpp indexes its vocabulary with the id unchecked).
"""

from __future__ import annotations

from deployments.errors import InvalidRequestError


def check_token_ids(tokens: list[int], vocab_size: int, param: str) -> list[int]:
    """`tokens` when every id is in ``0 .. vocab_size - 1``, else a 400 naming the first few outside."""
    if bad := sorted({t for t in tokens if not 0 <= t < vocab_size}):
        raise InvalidRequestError(f"Token ids outside the vocabulary (0 to {vocab_size - 1}): {bad[:5]}", param=param)
    return tokens

"""A prompt check every transformers decoder shares (text-only and native VLM): a legacy completion's
prompt as token ids. (The completion budget a context leaves is `context.Limits`.)"""

from __future__ import annotations

from typing import Any

from deployments.errors import InvalidRequestError


def raw_prompt_ids(tokenizer: Any, prompt: str | list[int], vocab_size: int) -> list[int]:
    """A legacy completion's prompt as it is: text tokenized with the tokenizer's own special tokens
    (e.g. a BOS where it adds one), token ids checked against the vocabulary."""
    ids = list(tokenizer(prompt).input_ids) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise InvalidRequestError("The prompt is empty.", param="prompt")
    if isinstance(prompt, list) and (bad := sorted({t for t in ids if not 0 <= t < vocab_size})):
        raise InvalidRequestError(
            f"The prompt has token ids outside the vocabulary (0 to {vocab_size - 1}): {bad[:5]}",
            param="prompt",
        )
    return ids

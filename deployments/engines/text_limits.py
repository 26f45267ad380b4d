"""Prompt checks every transformers decoder shares (text-only and native VLM): a legacy completion's
prompt as token ids, and the completion budget the context leaves (`ContextLengthError`, a 400
that gives the numbers, when the prompt and the requested tokens cannot fit)."""

from __future__ import annotations

from typing import Any

from deployments.errors import ContextLengthError, InvalidRequestError


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


def completion_budget(
    max_model_len: int,
    prompt_len: int,
    requested: int | None,
    default: int,
    *,
    field: str,
    image_tokens: int = 0,
) -> int:
    """The request's `max_tokens` (`requested`), or `default` cut to the context left. `ContextLengthError`
    (400, nothing truncated) naming `field` when the prompt and the requested tokens cannot fit; a
    prompt with images says how many of its tokens are image tokens."""
    room = max_model_len - prompt_len
    wanted = requested or min(default, room)
    if wanted > room or room < 1:
        images = f" ({image_tokens} of them image tokens)" if image_tokens else ""
        raise ContextLengthError(
            f"This model's context is {max_model_len} tokens; the prompt has {prompt_len}{images} and "
            f"{wanted} completion tokens were requested. Shorten the {field} or max_tokens.",
            param=field,
        )
    return wanted

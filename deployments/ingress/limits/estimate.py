"""What a request may cost in tokens, from its JSON body before anything reads it: the tokens per
minute that its admission reserves (OpenAI's rule: an estimate of the prompt from its characters,
plus `max_tokens` for each choice). The real count settles it when it ends."""

from __future__ import annotations

from typing import Any

CHARS_PER_TOKEN = 4  # English text in the BPE vocabularies of the models served; the settlement corrects it
IMAGE_TOKENS = 85  # an image's caption or its place holder (OpenAI counts a low-detail image as 85)
_IMAGE_KEYS = frozenset({"image_url", "url", "file_data", "data", "image"})
_MAX_TOKENS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def prompt_tokens(body: Any) -> int:
    """The prompt's estimate: its strings' characters over `CHARS_PER_TOKEN` (names and settings
    included, as a chat template adds its own), an image's data or URL as `IMAGE_TOKENS`."""
    chars, images = _walk(body)
    return chars // CHARS_PER_TOKEN + images * IMAGE_TOKENS + 1


def completion_tokens(body: dict[str, Any], default: int) -> int:
    """The completion budget: the request's max tokens (`default` when it sets none) for each of its `n` choices."""
    asked = next((body[k] for k in _MAX_TOKENS if isinstance(body.get(k), int) and body[k] > 0), default)
    n = body.get("n")
    return asked * (n if isinstance(n, int) and 0 < n <= 128 else 1)


def _walk(value: Any, key: str = "") -> tuple[int, int]:
    if isinstance(value, str):
        if key in _IMAGE_KEYS or value.startswith("data:"):
            return 0, 1
        return len(value), 0
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    chars = images = 0
    for k, v in items:
        c, i = _walk(v, k if isinstance(k, str) else key)
        chars, images = chars + c, images + i
    return chars, images

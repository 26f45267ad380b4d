"""A key's buckets as the headers its clients read: OpenAI's `x-ratelimit-*` (resets as durations,
`6m0s`), Anthropic's `anthropic-ratelimit-*` on /v1/messages (resets as RFC 3339 times), and on a
429 `Retry-After` (whole seconds) with `retry-after-ms`, which both SDKs read first; a request too
large ever to fit also says `x-should-retry: false`, which both SDKs obey.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from deployments.ingress.limits.ledger import Verdict, Window


def rate_headers(verdict: Verdict, anthropic: bool) -> dict[str, str]:
    """The buckets' headers (only those of the limits the key has)."""
    headers: dict[str, str] = {}
    for kind, window in (("requests", verdict.requests), ("tokens", verdict.tokens)):
        if window is not None:
            headers.update(_anthropic(kind, window) if anthropic else _openai(kind, window))
    return headers


def retry_headers(verdict: Verdict) -> dict[str, str]:
    """A refusal's: when to try again, or not to."""
    if verdict.limit == "too_large":
        return {"x-should-retry": "false"}
    wait = max(verdict.retry_after_s, 0.001)
    return {"Retry-After": str(math.ceil(wait)), "retry-after-ms": str(math.ceil(wait * 1000))}


def _openai(kind: str, window: Window) -> dict[str, str]:
    return {
        f"x-ratelimit-limit-{kind}": str(window.limit),
        f"x-ratelimit-remaining-{kind}": str(window.remaining),
        f"x-ratelimit-reset-{kind}": duration(window.reset_s),
    }


def _anthropic(kind: str, window: Window) -> dict[str, str]:
    at = datetime.now(UTC) + timedelta(seconds=window.reset_s)
    return {
        f"anthropic-ratelimit-{kind}-limit": str(window.limit),
        f"anthropic-ratelimit-{kind}-remaining": str(window.remaining),
        f"anthropic-ratelimit-{kind}-reset": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def duration(seconds: float) -> str:
    """OpenAI's reset durations: `120ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{math.ceil(seconds * 100) / 100:g}s"
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes}m{rest}s"

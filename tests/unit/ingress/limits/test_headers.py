"""The rate-limit headers in each API's words, and the request cost estimate."""

from __future__ import annotations

from datetime import UTC, datetime

from deployments.ingress.limits import estimate
from deployments.ingress.limits.headers import duration, rate_headers, retry_headers
from deployments.ingress.limits.ledger import Verdict, Window


def test_openai_headers_name_both_windows_with_durations() -> None:
    verdict = Verdict(1, Window(60, 59, 1.0), Window(20000, 19000, 180.2))
    assert rate_headers(verdict, anthropic=False) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "20000",
        "x-ratelimit-remaining-tokens": "19000",
        "x-ratelimit-reset-tokens": "3m1s",
    }


def test_anthropic_headers_reset_at_a_time() -> None:
    headers = rate_headers(Verdict(1, None, Window(100, 0, 30.0)), anthropic=True)
    assert set(headers) == {
        "anthropic-ratelimit-tokens-limit",
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-tokens-reset",
    }
    reset = datetime.strptime(headers["anthropic-ratelimit-tokens-reset"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert 28 <= (reset - datetime.now(UTC)).total_seconds() <= 31


def test_retry_headers_round_up_and_a_request_too_large_says_not_to_retry() -> None:
    assert retry_headers(Verdict(None, limit="requests", retry_after_s=1.2)) == {
        "Retry-After": "2",
        "retry-after-ms": "1200",
    }
    assert retry_headers(Verdict(None, limit="too_large")) == {"x-should-retry": "false"}


def test_durations() -> None:
    assert [duration(s) for s in (0.0123, 0.5, 1.0, 1.234, 59.5, 60, 360.2)] == [
        "13ms",
        "500ms",
        "1s",
        "1.24s",
        "59.5s",
        "1m0s",
        "6m1s",
    ]


def test_the_estimate_counts_text_and_images_but_not_image_bytes() -> None:
    image = "data:image/png;base64," + "A" * 100_000
    body = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "x" * 400}, {"type": "image_url", "image_url": {"url": image}}],
            }
        ],
    }
    tokens = estimate.prompt_tokens(body)
    assert 100 + estimate.IMAGE_TOKENS <= tokens < 100 + estimate.IMAGE_TOKENS + 20
    assert estimate.completion_tokens({"max_tokens": 50, "n": 3}, default=256) == 150
    assert estimate.completion_tokens({"max_output_tokens": 7}, default=256) == 7
    assert estimate.completion_tokens({}, default=256) == 256

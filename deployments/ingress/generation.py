"""What chat and legacy completions share: the generation settings as the decoder takes them, the
deadline's error, and the `Reply` the route sends."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from deployments.errors import InvalidRequestError, RequestTimeoutError
from deployments.protocol.openai.common import SamplingFields


@dataclass
class Reply:
    """What the route sends: a completion body or server-sent events, with extra headers."""

    headers: dict[str, str] = field(default_factory=dict)
    body: dict | None = None
    events: AsyncIterator[str] | None = None


def sampling_fields(body: SamplingFields, max_n: int) -> dict[str, Any]:
    """`GenerateRequest` fields of the request's sampling settings; `n` beyond `max_n` and
    `logit_bias` keys that are not token ids are 400s."""
    if body.n > max_n:
        raise InvalidRequestError(f"n is {body.n}; this server allows at most {max_n} (server.max_n).", param="n")
    return {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "frequency_penalty": body.frequency_penalty,
        "presence_penalty": body.presence_penalty,
        "stop": body.stop_sequences,
        "seed": body.seed,
        "n": body.n,
        "logit_bias": _token_bias(body.logit_bias),
    }


def _token_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    if not bias:
        return None
    try:
        return {int(token): value for token, value in bias.items()}
    except ValueError:
        raise InvalidRequestError(
            "logit_bias keys must be token ids (integers, as strings).", param="logit_bias"
        ) from None


def timed_out(timeout_s: float) -> RequestTimeoutError:
    return RequestTimeoutError(
        f"The request did not finish within {timeout_s:g} s (server.request_timeout_s); its generation was cancelled."
    )

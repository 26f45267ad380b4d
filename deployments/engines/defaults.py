"""A request's settings as every engine runs it, resolved in this one place: each sampling field is
the request's value, else the model's default from ``params:`` (`setting`), and its room in the
context is the request's `max_tokens`, else the model's default cut to the context left (`limits`).
"""

from __future__ import annotations

from typing import Any

from deployments.config import EngineParams
from deployments.engines.context import Limits
from deployments.protocol.replica import GenerateRequest

SAMPLING = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty")
"""The request's sampling fields that fall back to the model's defaults."""


def setting(request: GenerateRequest, params: EngineParams, name: str) -> Any:
    """The request's value of the sampling field `name`, or the model's default when it left it unset."""
    if name not in SAMPLING:
        raise ValueError(f"{name} is not a sampling field with a model default")
    value = getattr(request, name)
    return value if value is not None else getattr(params, name)


def limits(max_model_len: int, request: GenerateRequest, params: EngineParams) -> Limits:
    """The request's room in a context of `max_model_len` tokens (`context.Limits`): its `max_tokens`,
    or the model's default.
    """
    return Limits(max_model_len, request.max_tokens, params.max_tokens, ceiling=request.max_tokens_ceiling)

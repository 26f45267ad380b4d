"""vLLM's request extensions that an engine may not honour: each set to something other than its
default is named here, so that an engine refuses what it cannot do with a 400 naming the field,
never silently ignoring it (docs/api.md lists which engine honours which).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from deployments.errors import InvalidRequestError
from deployments.protocol.replica import GenerateRequest

_ASKED: dict[str, Callable[[GenerateRequest], bool]] = {
    "repetition_penalty": lambda r: r.repetition_penalty not in (None, 1.0),
    "min_tokens": lambda r: r.min_tokens > 0,
    "ignore_eos": lambda r: r.ignore_eos,
    "stop_token_ids": lambda r: bool(r.stop_token_ids),
    "skip_special_tokens": lambda r: not r.skip_special_tokens,
    "include_stop_str_in_output": lambda r: r.include_stop_str_in_output,
    "chat_template_kwargs": lambda r: bool(r.chat_template_kwargs),
    "add_generation_prompt": lambda r: not r.add_generation_prompt,
    "continue_final_message": lambda r: r.continue_final_message,
}


def refuse_unsupported(
    request: GenerateRequest, fields: Iterable[str], engine: str, why: Mapping[str, str] | None = None
) -> None:
    """A 400 naming the first of `fields` that the request sets (away from its default), and why the
    engine cannot honour it where `why` says.
    """
    for name in fields:
        if _ASKED[name](request):
            reason = f": {why[name]}" if why and name in why else ""
            raise InvalidRequestError(f"{name} is not supported by this model's engine ({engine}){reason}.", param=name)


# A chat rendering's own arguments (transformers' apply_chat_template, llama.cpp's): never a template
# variable of the request's.
_RENDER_ARGUMENTS = frozenset(
    {
        "conversation",
        "conversations",  # transformers' render_jinja_template's own
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def template_variables(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The template's variables from vLLM's `chat_template_kwargs`; one that names an argument of the
    rendering itself is a 400 (add_generation_prompt and continue_final_message are fields of their own).
    """
    if not kwargs:
        return {}
    if taken := sorted(_RENDER_ARGUMENTS & kwargs.keys()):
        raise InvalidRequestError(
            f"chat_template_kwargs cannot set {', '.join(taken)} (an argument of the rendering itself).",
            param="chat_template_kwargs",
        )
    return dict(kwargs)

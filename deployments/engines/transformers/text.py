"""A transformers causal LM (hub id, local directory or GGUF file) as a text decoder: what the
sequential and the continuous-batching engines share on top of `TransformersDecoder`.

The prompt is a chat rendered by the model's template (with tools as its tool-call format has them:
`chat_template.ToolRendering`), or a
legacy completion's text or token ids used as they are. A chat is fitted to the context by
`context.fit_context` (a 400, or with `context_overflow: truncate` its oldest turns dropped whole);
a legacy prompt is never cut. The per-request constraints (`constraints.py`: logit bias, JSON
grammar, logprobs) are built here, off the event loop, with the prompt.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from transformers import AutoModelForCausalLM, AutoTokenizer

from deployments.config import ModelConfig
from deployments.engines.context import fit_rendered
from deployments.engines.extensions import template_variables
from deployments.engines.transformers.base import TransformersDecoder
from deployments.engines.transformers.chat_template import marker_token_ids, raw_prompt_ids, resolve_tool_rendering
from deployments.engines.transformers.constraints import RequestConstraints, build_constraints
from deployments.errors import ConfigError, InvalidRequestError
from deployments.protocol.replica import GenerateRequest, TextMessage, TokenizeInput
from deployments.roles import Role
from deployments.tools.prompt import template_message


@dataclass(frozen=True)
class Prepared:
    """A request made ready for an engine: the prompt's token ids, the completion budget, the
    constraints on its tokens (None: none) and the prompt tokens that truncation dropped.
    """

    prompt: list[int]
    max_tokens: int
    constraints: RequestConstraints | None
    dropped_prompt_tokens: int = 0


class TransformersTextEngine(TransformersDecoder):
    """A causal LM's prompt and limits, shared by the sequential and the continuous-batching decoders."""

    FRONT = ("tokenizer", AutoTokenizer)
    MODEL = AutoModelForCausalLM

    def __init__(self, model: ModelConfig, **load: Any) -> None:
        super().__init__(Role.DECODER, model, **load)
        self.tools = resolve_tool_rendering(self.tokenizer, model.capabilities.tool_call_format, model.name)
        self.tool_format = self.tools.format
        self.tool_marker_ids = marker_token_ids(self.tokenizer, self.tool_format)
        self.progress.done(self.model)

    def check_front(self, model: ModelConfig) -> None:
        if not self.tokenizer.chat_template:
            raise ConfigError(f"model {model.name!r}: tokenizer has no chat template; use an instruct model")

    def _kv_bytes_per_token(self) -> int:
        """KV-cache bytes of one token: K and V of every layer, over the KV heads, in the model's dtype
        (what the continuous-batching and static-slot engines size their caches by).
        """
        cfg = self.model.config.get_text_config()
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        return int(2 * cfg.num_hidden_layers * kv_heads * head_dim * self.model.dtype.itemsize)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "tool_call_format": self.tool_format}

    async def prepare(self, request: GenerateRequest) -> Prepared:
        """The prompt's token ids, the completion budget and the constraints (tokenizing and compiling
        a grammar happen off the event loop).
        """
        return await asyncio.to_thread(self._prepare, request)

    def _prepare(self, request: GenerateRequest) -> Prepared:
        constraints = build_constraints(request, self.vocab_size, self.grammars)
        if request.prompt is not None:
            ids = raw_prompt_ids(self.tokenizer, request.prompt, self.vocab_size)
            return Prepared(ids, self.limits(request).completion(len(ids), "prompt"), constraints)
        ids, fitted = fit_rendered(
            request.messages,
            lambda chat: self.chat_ids(
                chat,
                request.tools,
                add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message,
                template_kwargs=request.chat_template_kwargs,
            ),
            len,
            self.limits(request),
            self.params.context_overflow,
        )
        return Prepared(ids, fitted.max_tokens, constraints, fitted.dropped_prompt_tokens)

    def chat_ids(
        self,
        messages: list[TextMessage],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        add_special_tokens: bool = False,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Messages rendered by the model's template (by default with the generation prompt, as a
        request is prompted) and `tools`; `add_special_tokens`: the tokenizer's own (a BOS) added to
        the rendered text too; `template_kwargs`: vLLM's `chat_template_kwargs`, the template's extra
        variables.
        """
        chat, extra = self.tools.chat([template_message(m) for m in messages], tools)
        variables = template_variables(template_kwargs)
        try:
            text = self.tokenizer.apply_chat_template(
                chat,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=False,
                **{**variables, **extra},
            )
        except TypeError as exc:  # a variable that collides with one of transformers' own arguments
            if not variables:
                raise
            raise InvalidRequestError(f"chat_template_kwargs: {exc}", param="chat_template_kwargs") from None
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens).input_ids)

    def prompt_ids(self, request: TokenizeInput) -> tuple[list[int], int]:
        if request.prompt is not None:
            return list(self.tokenizer(request.prompt, add_special_tokens=request.special_tokens).input_ids), 0
        ids = self.chat_ids(
            request.messages,
            request.tools,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            add_special_tokens=request.special_tokens,
        )
        return ids, 0

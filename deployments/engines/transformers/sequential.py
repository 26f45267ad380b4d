"""`batching: sequential`: one `model.generate` thread per request, its token ids streamed back to
the event loop (a `ThreadStream`); closing the stream sets a stop flag that `generate` checks after
every token. It supports seeds and penalties for any model, and applies the request's constraints
with a logits processor.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.generation.streamers import BaseStreamer

from deployments.engines.bridge import ThreadStream
from deployments.engines.transformers.constraints import ConstrainedStep, RequestConstraints, constrain
from deployments.engines.transformers.sampling import Sampling, penalize
from deployments.engines.transformers.stream import TokenStream
from deployments.engines.transformers.text import TransformersTextEngine
from deployments.protocol.replica import GenerateRequest


class _TokenStreamer(BaseStreamer):
    """Forwards generated token ids from the generate thread to the request's `ThreadStream`;
    `on_token` sees each one first, in that thread (the constraints learn the token a step chose).
    """

    def __init__(self, stream: ThreadStream[list[int]], on_token: Callable[[torch.Tensor], None] | None = None) -> None:
        self._stream, self._prompt_seen, self._on_token = stream, False, on_token

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # generate() first hands over the prompt itself
            self._prompt_seen = True
            return
        if self._on_token is not None:
            self._on_token(value)
        self._stream.send(value.reshape(-1).tolist())

    def end(self) -> None:
        pass


class _Cancelled(StoppingCriteria):
    def __init__(self, flag: threading.Event) -> None:
        self._flag = flag

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        done = torch.full((input_ids.shape[0],), self._flag.is_set(), dtype=torch.bool, device=input_ids.device)
        return done  # type: ignore[return-value]


class OpenAIPenalties(LogitsProcessor):
    """OpenAI's additive presence/frequency penalties over the completion's tokens so far."""

    def __init__(self, prompt_len: int, frequency: float, presence: float) -> None:
        self.prompt_len, self.frequency, self.presence = prompt_len, frequency, presence

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        generated = input_ids[:, self.prompt_len :]
        return penalize(scores, generated, self.frequency, self.presence)  # type: ignore[return-value]


class Suppress(LogitsProcessor):
    """vLLM's `ignore_eos` and `min_tokens`: `banned` tokens never chosen, `held` ones not before
    `until` tokens are generated.
    """

    def __init__(self, prompt_len: int, banned: tuple[int, ...], held: tuple[int, ...], until: int) -> None:
        self.prompt_len, self.banned, self.held, self.until = prompt_len, list(banned), list(held), until

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        ids = self.banned + (self.held if input_ids.shape[1] - self.prompt_len < self.until else [])
        if ids:
            scores[:, ids] = float("-inf")
        return scores


class ConstraintsProcessor(LogitsProcessor):
    """A request's `RequestConstraints` inside `model.generate` (one sequence): listed before the
    warpers, so its logprobs come from the raw logits and the bias and grammar mask come before
    temperature, top-k and top-p. `accept` (from the streamer) hands it the token the step chose.
    """

    def __init__(self, constraints: RequestConstraints) -> None:
        self._constraints = constraints
        self._step: ConstrainedStep | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._step = constrain(scores, [self._constraints])
        return scores

    def accept(self, token: torch.Tensor) -> None:
        if self._step is not None:
            self._step.accept(token)
            self._step = None


class SequentialTextEngine(TransformersTextEngine):
    """One `model.generate` thread per request (`batching: sequential`)."""

    def _generation_config(self, sampling: Sampling, max_tokens: int) -> GenerationConfig:
        options: dict[str, Any] = {"do_sample": False}
        if not sampling.greedy:  # 0 means greedy: never divide by it
            options = {
                "do_sample": True,
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "top_k": sampling.top_k or None,
                "min_p": sampling.min_p or None,
            }
        return GenerationConfig(max_new_tokens=max_tokens, **options, **self.special)

    async def start(self, request: GenerateRequest) -> TokenStream:
        self.require_adapter(request.adapter)
        prepared = await self.prepare(request)
        config = self._generation_config(self.sampling(request), prepared.max_tokens)
        frequency, presence = self.penalties(request)
        processors = LogitsProcessorList()
        constrained = None
        if prepared.constraints is not None:  # first: raw logprobs, then bias and grammar before the penalties
            constrained = ConstraintsProcessor(prepared.constraints)
            processors.append(constrained)
        banned, held = self.suppressed(request)
        if banned or (held and request.min_tokens):
            processors.append(Suppress(len(prepared.prompt), banned, held, request.min_tokens))
        if request.repetition_penalty not in (None, 1.0):
            processors.append(RepetitionPenaltyLogitsProcessor(float(request.repetition_penalty)))
        if frequency or presence:
            processors.append(OpenAIPenalties(len(prepared.prompt), frequency, presence))
        input_ids = torch.tensor([prepared.prompt], device=self.device)

        async def tokens() -> AsyncIterator[list[int]]:
            with ThreadStream[list[int]]() as stream:
                streamer = _TokenStreamer(stream, constrained.accept if constrained else None)

                def generate() -> None:
                    if request.seed is not None:
                        torch.manual_seed(request.seed)
                    # With LoRA, one generation at a time: the adapters' hooks are on the shared modules.
                    with self.lora_rows([request.adapter]), torch.inference_mode():
                        self.model.generate(
                            input_ids=input_ids,
                            attention_mask=torch.ones_like(input_ids),
                            generation_config=config,
                            logits_processor=processors,
                            stopping_criteria=StoppingCriteriaList([_Cancelled(stream.cancelled)]),
                            streamer=streamer,
                        )

                threading.Thread(target=stream.run, args=(generate,), name="generate", daemon=True).start()
                async for ids in stream:
                    yield ids

        return TokenStream(
            tokens(), len(prepared.prompt), prepared.max_tokens, prepared.constraints, prepared.dropped_prompt_tokens
        )

"""A transformers causal LM (hub id, local directory or GGUF file) as a streaming `TextEngine`.

`TransformersTextEngine` holds what every transformers decoder shares: loading, the prompt (a chat
rendered by the model's template, with tools when it supports them, or a legacy completion's text or
token ids used as they are), the context check (a chat fitted by `context.fit_context`: a 400, or with
`context_overflow: truncate` its oldest turns dropped whole; a legacy prompt is never cut), sampling
defaults, the per-request constraints
(`constraints.py`: logit bias, JSON grammar, logprobs) and incremental detokenization.
`SequentialTextEngine` (`batching: sequential`) runs `model.generate` in a thread per request and
streams token ids back to the event loop; closing the iterator sets a stop flag that `generate`
checks after every token. It supports seeds and penalties, which the continuous batching engine
(`hf_batching.py`) does not, and applies the constraints with a logits processor.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.generation.streamers import BaseStreamer

from deployments.config import ModelConfig
from deployments.engines.base import EngineOutput, TextEngine
from deployments.engines.constraints import (
    ConstrainedStep,
    GrammarCompiler,
    LogprobStream,
    RequestConstraints,
    TokenTexts,
    build_constraints,
    constrain,
)
from deployments.engines.context import Limits, fit_context
from deployments.engines.loading import load_kwargs, place, quantize_loaded, set_cpu_threads
from deployments.engines.progress import LoadProgress
from deployments.engines.text_limits import raw_prompt_ids
from deployments.errors import ConfigError, InvalidRequestError
from deployments.protocol import GenerateRequest, TextMessage

_END = object()


class _QueueStreamer(BaseStreamer):
    """Forwards generated token ids from the generate thread to an asyncio queue; `on_token` sees each
    one first, in that thread (the constraints learn the token a step chose)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        queue: asyncio.Queue,
        on_token: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        self._loop, self._queue, self._prompt_seen, self._on_token = loop, queue, False, on_token

    def send(self, item: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone (shutdown): nobody listens any more
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # generate() first hands over the prompt itself
            self._prompt_seen = True
            return
        if self._on_token is not None:
            self._on_token(value)
        self.send(value.reshape(-1).tolist())

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
        if generated.shape[1] == 0:
            return scores
        counts = torch.zeros_like(scores).scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        penalized = scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)
        return penalized  # type: ignore[return-value]


class ConstraintsProcessor(LogitsProcessor):
    """A request's `RequestConstraints` inside `model.generate` (one sequence): listed before the
    warpers, so its logprobs come from the raw logits and the bias and grammar mask come before
    temperature, top-k and top-p. `accept` (from the streamer) hands it the token the step chose."""

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


@dataclass(frozen=True)
class Prepared:
    """A request made ready for an engine: the prompt's token ids, the completion budget, the
    constraints on its tokens (None: none) and the prompt tokens that truncation dropped."""

    prompt: list[int]
    max_tokens: int
    constraints: RequestConstraints | None
    dropped_prompt_tokens: int = 0


def template_message(message: TextMessage) -> dict[str, Any]:
    """A message in transformers' chat-template convention: an assistant's `tool_calls` as
    `{"type": "function", "function": {"name", "arguments": <dict>}}` (templates render the
    arguments with `tojson` or iterate them), a tool answer with its `tool_call_id`."""
    rendered: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        rendered["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    return rendered


def _arguments(text: str) -> Any:
    """OpenAI's arguments (JSON text) as the object templates expect; text that is no JSON object stays text."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, dict) else text


_TOOL_PROBE = "mmserve_tool_probe"


def template_tools(tools: list[dict[str, Any]] | None, supported: bool) -> dict[str, Any]:
    """`apply_chat_template`'s arguments for a request's `tools`; a 400 when the model's template
    does not render them (`template_supports_tools`)."""
    if not tools:
        return {}
    if not supported:
        raise InvalidRequestError(
            "This model's chat template does not support tools; send the request without `tools`.", param="tools"
        )
    return {"tools": tools}


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the chat template renders a tool list: a probe tool's name must appear in the prompt
    (SmolLM2's template never reads `tools`, so a tool list would vanish silently)."""
    parameters = {"type": "object", "properties": {"x": {"type": "string", "description": "x"}}, "required": ["x"]}
    probe = [{"type": "function", "function": {"name": _TOOL_PROBE, "description": "probe", "parameters": parameters}}]
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tools=probe, tokenize=False, add_generation_prompt=True
        )
    except Exception:  # a template that fails on tools does not support them
        return False
    return _TOOL_PROBE in str(text)


@dataclass(frozen=True)
class Sampling:
    """A request's sampling settings resolved against the model's defaults; temperature 0 is greedy."""

    temperature: float
    top_p: float
    top_k: int

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class IncrementalText:
    """Turns a growing list of token ids into text deltas, holding back incomplete characters."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.ids: list[int] = []
        self._emitted = ""

    def feed(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        return self._delta(final=False)

    def flush(self) -> str:
        """Everything not yet emitted, incomplete characters included (the sequence has ended)."""
        return self._delta(final=True)

    def _delta(self, *, final: bool) -> str:
        text = str(self._tokenizer.decode(self.ids, skip_special_tokens=True))
        if not final and text.endswith("\ufffd"):  # a multi-byte character is still incomplete
            return ""
        delta, self._emitted = text[len(self._emitted) :], text
        return delta


class TransformersTextEngine(TextEngine):
    """Loading, prompt and limits shared by the transformers decoders."""

    device: str

    def __init__(self, model: ModelConfig, **load: Any) -> None:
        self.params = model.params
        progress = LoadProgress("decoder", model)
        self.device, shared, kwargs = load_kwargs(model)
        self.tokenizer = progress.pretrained("tokenizer", AutoTokenizer.from_pretrained, model.source, **shared)
        if not self.tokenizer.chat_template:
            raise ConfigError(f"model {model.name!r}: tokenizer has no chat template; use an instruct model")
        lm = progress.pretrained("model", AutoModelForCausalLM.from_pretrained, model.source, **kwargs, **load)
        self.model = place(lm, self.device, kwargs).eval()
        progress.loaded(self.model, kwargs)
        self.int4_layers = quantize_loaded(self.model, self.params, self.device, progress)
        own_len = getattr(self.model.config, "max_position_embeddings", None) or 2048
        self.max_model_len = min(self.params.max_model_len or own_len, own_len)
        gen: Any = self.model.generation_config
        self._special = {
            "eos_token_id": gen.eos_token_id if gen.eos_token_id is not None else self.tokenizer.eos_token_id,
            "pad_token_id": gen.pad_token_id if gen.pad_token_id is not None else self.tokenizer.eos_token_id,
            "bos_token_id": gen.bos_token_id,
        }
        self.source = model.weight_file or model.source
        self.cpu_threads = set_cpu_threads(self.params, self.device)
        # Token ids a request may name (prompt, logit_bias): the tokenizer's, that the model has rows for.
        self.vocab_size = min(len(self.tokenizer), int(self.model.config.get_text_config().vocab_size))
        self.supports_tools = template_supports_tools(self.tokenizer)
        eos = self._special["eos_token_id"]
        self.eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos])]
        logits = int(self.model.config.get_text_config().vocab_size)
        self.grammars = GrammarCompiler(self.tokenizer, logits, self.eos_ids)
        self.token_texts = TokenTexts(self.tokenizer)
        progress.done(self.model)

    def describe(self) -> dict[str, Any]:
        return {
            **self.params.model_dump(),
            "source": self.source,
            "device": self.device,
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "max_model_len": self.max_model_len,
            "int4_layers": self.int4_layers,
            "cpu_threads": self.cpu_threads,
            "tools": self.supports_tools,
        }

    def close(self) -> None:
        del self.model
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    async def prepare(self, request: GenerateRequest) -> Prepared:
        """The prompt's token ids, the completion budget and the constraints (tokenizing and compiling
        a grammar happen off the event loop)."""
        return await asyncio.to_thread(self._prepare, request)

    def _prepare(self, request: GenerateRequest) -> Prepared:
        constraints = build_constraints(request, self.vocab_size, self.grammars)
        if request.prompt is not None:
            ids = self._raw_prompt(request.prompt)
            return Prepared(ids, self.max_tokens(request, len(ids)), constraints)
        rendered: dict[tuple[int, ...], list[int]] = {}  # the chats `fit_context` counted, by their messages

        def count(messages: list[TextMessage]) -> int:
            key = tuple(map(id, messages))
            if key not in rendered:
                rendered[key] = self._chat_ids(messages, request.tools)
            return len(rendered[key])

        fitted = fit_context(request.messages, count, self.limits(request), self.params.context_overflow)
        ids = rendered[tuple(map(id, fitted.messages))]
        return Prepared(ids, fitted.max_tokens, constraints, fitted.dropped_prompt_tokens)

    def prompt_ids(self, request: GenerateRequest) -> list[int]:
        """A legacy completion's prompt as it is (text tokenized with the tokenizer's own special
        tokens, e.g. a BOS where it adds one; token ids checked against the vocabulary), or the whole
        chat rendered by the model's template with `tools`."""
        if request.prompt is not None:
            return self._raw_prompt(request.prompt)
        return self._chat_ids(request.messages, request.tools)

    def _chat_ids(self, messages: list[TextMessage], tools: list[dict[str, Any]] | None) -> list[int]:
        """Messages rendered by the model's template (with the generation prompt) and `tools`."""
        extra = template_tools(tools, self.supports_tools)
        chat = [template_message(m) for m in messages]
        encoded = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True, **extra)
        return list(encoded["input_ids"])  # type: ignore[index,call-overload,arg-type]

    def _raw_prompt(self, prompt: str | list[int]) -> list[int]:
        return raw_prompt_ids(self.tokenizer, prompt, self.vocab_size)

    def max_tokens(self, request: GenerateRequest, prompt_len: int) -> int:
        """A legacy prompt's completion limit: the request's `max_tokens`, or the default cut to the
        context left. `ContextLengthError` (400, nothing truncated) when they cannot fit."""
        return self.limits(request).completion(prompt_len, "prompt")

    def limits(self, request: GenerateRequest) -> Limits:
        """The request's room in this model's context (`context.Limits`)."""
        return Limits(self.max_model_len, request.max_tokens, self.params.max_tokens)

    def _setting(self, request: GenerateRequest, name: str) -> Any:
        """The request's value of a sampling field, or the model's default when the request left it unset."""
        value = getattr(request, name)
        return value if value is not None else getattr(self.params, name)

    def sampling(self, request: GenerateRequest) -> Sampling:
        return Sampling(*(self._setting(request, name) for name in ("temperature", "top_p", "top_k")))

    def penalties(self, request: GenerateRequest) -> tuple[float, float]:
        """`(frequency, presence)` OpenAI penalties of the request, or the model's defaults."""
        return self._setting(request, "frequency_penalty"), self._setting(request, "presence_penalty")

    @staticmethod
    def finish_reason(generated: int, max_tokens: int) -> Literal["stop", "length"]:
        return "length" if generated >= max_tokens else "stop"


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
            }
        return GenerationConfig(max_new_tokens=max_tokens, **options, **self._special)

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[EngineOutput, None]:
        prepared = await self.prepare(request)
        prompt, max_tokens = prepared.prompt, prepared.max_tokens
        config = self._generation_config(self.sampling(request), max_tokens)
        frequency, presence = self.penalties(request)
        processors = LogitsProcessorList()
        constrained = None
        if prepared.constraints is not None:  # first: raw logprobs, then bias and grammar before the penalties
            constrained = ConstraintsProcessor(prepared.constraints)
            processors.append(constrained)
        if frequency or presence:
            processors.append(OpenAIPenalties(len(prompt), frequency, presence))

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()
        input_ids = torch.tensor([prompt], device=self.device)
        streamer = _QueueStreamer(loop, queue, constrained.accept if constrained is not None else None)

        def run() -> None:
            try:
                if request.seed is not None:
                    torch.manual_seed(request.seed)
                with torch.inference_mode():
                    self.model.generate(
                        input_ids=input_ids,
                        attention_mask=torch.ones_like(input_ids),
                        generation_config=config,
                        logits_processor=processors,
                        stopping_criteria=StoppingCriteriaList([_Cancelled(cancel)]),
                        streamer=streamer,
                    )
            except BaseException as exc:  # surfaces in the request, not in a dead thread
                streamer.send(exc)
            finally:
                streamer.send(_END)

        threading.Thread(target=run, name="generate", daemon=True).start()
        text = IncrementalText(self.tokenizer)
        logprobs = LogprobStream(prepared.constraints, self.token_texts)
        try:
            while (item := await queue.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                if delta := text.feed(item):
                    n = len(text.ids)
                    yield EngineOutput(delta, n, len(prompt), logprobs=logprobs.take(n))
            finish = self.finish_reason(len(text.ids), max_tokens)
            n = len(text.ids)
            yield EngineOutput(
                text.flush(),
                n,
                len(prompt),
                finish_reason=finish,
                logprobs=logprobs.take(n),
                truncated_prompt_tokens=prepared.dropped_prompt_tokens,
            )
        finally:
            cancel.set()

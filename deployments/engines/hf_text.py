"""A transformers causal LM (hub id, local directory or GGUF file) as a streaming `TextEngine`.

`TransformersTextEngine` holds what every transformers decoder shares: loading, the chat prompt,
the context check, sampling defaults and incremental detokenization. `SequentialTextEngine`
(`batching: sequential`) runs `model.generate` in a thread per request and streams token ids back
to the event loop; closing the iterator sets a stop flag that `generate` checks after every token.
It supports seeds and penalties, which the continuous batching engine (`hf_batching.py`) does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator
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
from deployments.engines.loading import load_kwargs, place, quantize_loaded, set_cpu_threads
from deployments.engines.progress import LoadProgress
from deployments.errors import ConfigError, ContextLengthError
from deployments.protocol import GenerateRequest

_END = object()


class _QueueStreamer(BaseStreamer):
    """Forwards generated token ids from the generate thread to an asyncio queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
        self._loop, self._queue, self._prompt_seen = loop, queue, False

    def send(self, item: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone (shutdown): nobody listens any more
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # generate() first hands over the prompt itself
            self._prompt_seen = True
            return
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
        }

    def close(self) -> None:
        del self.model
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    async def prepare(self, request: GenerateRequest) -> tuple[list[int], int]:
        """The chat prompt's token ids (tokenized off the event loop) and the completion budget."""
        ids = await asyncio.to_thread(self.prompt_ids, request)
        return ids, self.max_tokens(request, len(ids))

    def prompt_ids(self, request: GenerateRequest) -> list[int]:
        messages = [m.model_dump() for m in request.messages]
        encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
        return list(encoded["input_ids"])  # type: ignore[index,call-overload,arg-type]

    def max_tokens(self, request: GenerateRequest, prompt_len: int) -> int:
        """The request's `max_tokens`, or the default cut to the context left. `ContextLengthError` (400,
        nothing truncated) when the prompt and the requested tokens cannot fit."""
        room = self.max_model_len - prompt_len
        wanted = request.max_tokens or min(self.params.max_tokens, room)
        if wanted > room or room < 1:
            raise ContextLengthError(
                f"This model's context is {self.max_model_len} tokens; the prompt has {prompt_len} and "
                f"{wanted} completion tokens were requested. Shorten the messages or max_tokens.",
                param="messages",
            )
        return wanted

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
        prompt, max_tokens = await self.prepare(request)
        config = self._generation_config(self.sampling(request), max_tokens)
        frequency, presence = self.penalties(request)
        processors = LogitsProcessorList()
        if frequency or presence:
            processors.append(OpenAIPenalties(len(prompt), frequency, presence))

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()
        input_ids = torch.tensor([prompt], device=self.device)
        streamer = _QueueStreamer(loop, queue)

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
        try:
            while (item := await queue.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                if delta := text.feed(item):
                    yield EngineOutput(delta, completion_tokens=len(text.ids), prompt_tokens=len(prompt))
            finish = self.finish_reason(len(text.ids), max_tokens)
            yield EngineOutput(text.flush(), len(text.ids), len(prompt), finish_reason=finish)
        finally:
            cancel.set()

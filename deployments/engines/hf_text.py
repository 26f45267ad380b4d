"""A transformers causal LM (hub id, local directory or GGUF file) as a streaming `TextEngine`.

`generate` runs `model.generate` in a thread per request and streams token ids back to the event
loop; closing the iterator sets a stop flag that `generate` checks after every token. The number
of concurrent requests is bounded by the decoder deployment (`max_num_seqs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator
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
from deployments.engines.loading import load_kwargs, place
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


class TransformersTextEngine(TextEngine):
    def __init__(self, model: ModelConfig) -> None:
        self.model_name = model.name
        self.params = model.params
        self.device, shared, kwargs = load_kwargs(model)
        self.tokenizer = AutoTokenizer.from_pretrained(model.source, **shared)
        if not self.tokenizer.chat_template:
            raise ConfigError(f"model {model.name!r}: tokenizer has no chat template; use an instruct model")
        lm = AutoModelForCausalLM.from_pretrained(model.source, **kwargs)
        self.model = place(lm, self.device, kwargs).eval()
        own_len = getattr(self.model.config, "max_position_embeddings", None) or 2048
        self.max_model_len = min(self.params.max_model_len or own_len, own_len)
        gen: Any = self.model.generation_config
        self._special = {
            "eos_token_id": gen.eos_token_id if gen.eos_token_id is not None else self.tokenizer.eos_token_id,
            "pad_token_id": gen.pad_token_id if gen.pad_token_id is not None else self.tokenizer.eos_token_id,
            "bos_token_id": gen.bos_token_id,
        }
        self.source = model.weight_file or model.source

    def describe(self) -> dict[str, Any]:
        return {
            **self.params.model_dump(),
            "source": self.source,
            "device": self.device,
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "max_model_len": self.max_model_len,
        }

    def close(self) -> None:
        del self.model
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def _prompt_ids(self, request: GenerateRequest) -> list[int]:
        messages = [m.model_dump() for m in request.messages]
        encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
        return list(encoded["input_ids"])  # type: ignore[index,call-overload,arg-type]

    def _check_fits(self, prompt_len: int, max_tokens: int) -> None:
        if prompt_len + max_tokens > self.max_model_len:
            raise ContextLengthError(
                f"This model's context is {self.max_model_len} tokens; the prompt has {prompt_len} and "
                f"{max_tokens} completion tokens were requested. Shorten the messages or max_tokens.",
                param="messages",
            )

    def _generation_config(self, request: GenerateRequest, max_tokens: int) -> GenerationConfig:
        temperature = request.temperature if request.temperature is not None else self.params.temperature
        sampling: dict[str, Any] = {"do_sample": False}
        if temperature > 0:  # 0 means greedy: never divide by it
            top_k = request.top_k if request.top_k is not None else self.params.top_k
            sampling = {
                "do_sample": True,
                "temperature": temperature,
                "top_p": request.top_p if request.top_p is not None else self.params.top_p,
                "top_k": top_k or None,
            }
        return GenerationConfig(max_new_tokens=max_tokens, **sampling, **self._special)

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[EngineOutput, None]:
        prompt = self._prompt_ids(request)
        max_tokens = request.max_tokens or self.params.max_tokens
        self._check_fits(len(prompt), max_tokens)
        config = self._generation_config(request, max_tokens)
        frequency = (
            request.frequency_penalty if request.frequency_penalty is not None else self.params.frequency_penalty
        )
        presence = request.presence_penalty if request.presence_penalty is not None else self.params.presence_penalty
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
        generated: list[int] = []
        emitted = ""
        try:
            while (item := await queue.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                generated.extend(item)
                text = self._decode(generated)
                if text.endswith("\ufffd"):  # a multi-byte character is still incomplete
                    continue
                yield EngineOutput(text[len(emitted) :], new_tokens=len(item), prompt_tokens=len(prompt))
                emitted = text
            text = self._decode(generated)
            finish: Literal["stop", "length"] = "length" if len(generated) >= max_tokens else "stop"
            yield EngineOutput(text[len(emitted) :], prompt_tokens=len(prompt), finish_reason=finish)
        finally:
            cancel.set()

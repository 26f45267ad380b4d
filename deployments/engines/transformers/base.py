"""What every transformers engine shares. `TransformersEngine`: set-up (the tokenizer or processor
and the model from `model.source`, on the device Ray gave the replica, in its dtype, int4 on a CPU
where asked, torch's CPU threads; each step a logged load-progress line), the effective settings and
`close`. `TransformersDecoder` adds what the text-generating engines share: the context length, the
special tokens, the vocabulary a request may name, the grammar compiler, sampling resolved against
the model's defaults, and `generate`: each engine `start`s a request's sequence and the one
token-stream-to-output loop (`stream.stream_outputs`) turns its token ids into pieces.
"""

from __future__ import annotations

import contextlib
from abc import abstractmethod
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, ClassVar

import torch

from deployments.config import ModelConfig
from deployments.engines.base import Engine, EngineOutput, TextEngine
from deployments.engines.context import Limits
from deployments.engines.defaults import limits, setting
from deployments.engines.tokens import check_token_ids
from deployments.engines.transformers.constraints import GrammarCompiler, TokenTexts
from deployments.engines.transformers.loading import load_kwargs, place, quantize_loaded, set_cpu_threads
from deployments.engines.transformers.lora import LoraAdapters
from deployments.engines.transformers.progress import LoadProgress
from deployments.engines.transformers.sampler_args import SamplingParams
from deployments.engines.transformers.sampling import Sampling
from deployments.engines.transformers.stream import IncrementalText, StopTokens, TokenStream, stream_outputs
from deployments.errors import InvalidRequestError
from deployments.protocol.replica import GenerateRequest, TokenizedPrompt, TokenizeInput
from deployments.roles import Role


class TransformersEngine(Engine):
    """Loads `FRONT` (a tokenizer or a processor class) and `MODEL` (an auto model class); a subclass
    calls `self.progress.done(self.model)` once its own set-up is finished.
    """

    FRONT: ClassVar[tuple[str, Any]]  # (the load step's name, the class whose from_pretrained loads it)
    MODEL: ClassVar[Any]
    device: str

    def __init__(self, role: Role, model: ModelConfig, **load: Any) -> None:
        self.params = model.params
        self.source = model.weight_file or model.source
        self.progress = LoadProgress(role, model)
        self.device, shared, kwargs = load_kwargs(model)
        part, front = self.FRONT
        self.front = self.progress.pretrained(part, front.from_pretrained, model.source, **shared)
        self.tokenizer = getattr(self.front, "tokenizer", self.front)  # a processor's, or the tokenizer itself
        if model.chat_template is not None:  # checked by the builder: a Jinja file
            self.front.chat_template = Path(model.chat_template).read_text()
        self.check_front(model)
        loaded = self.progress.pretrained("model", self.MODEL.from_pretrained, model.source, **kwargs, **load)
        self.model = place(loaded, self.device, kwargs).eval()
        self.progress.loaded(self.model, kwargs)
        self.int4_layers = quantize_loaded(self.model, self.params, self.device, self.progress)
        self.cpu_threads = set_cpu_threads(self.params, self.device)

    def check_front(self, model: ModelConfig) -> None:
        """Refuse a tokenizer or processor this engine cannot use (before the weights are loaded)."""

    def describe(self) -> dict[str, Any]:
        return {
            "engine": "transformers",
            "source": self.source,
            "device": self.device,
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "int4_layers": self.int4_layers,
            "cpu_threads": self.cpu_threads,
        }

    def close(self) -> None:
        del self.model
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()


class TransformersDecoder(TransformersEngine, TextEngine):
    """A transformers engine that generates text for a `GenerateRequest`."""

    TEXT: ClassVar[type[IncrementalText]] = IncrementalText  # how `generate` detokenizes

    def __init__(self, role: Role, model: ModelConfig, **load: Any) -> None:
        super().__init__(role, model, **load)
        text = self.model.config.get_text_config()
        own_len = getattr(text, "max_position_embeddings", None) or 2048
        self.max_model_len = min(self.params.max_model_len or own_len, own_len)
        gen: Any = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.tokenizer.eos_token_id
        self.eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos])]
        pad = gen.pad_token_id if gen.pad_token_id is not None else self.tokenizer.pad_token_id
        self.special = {
            "eos_token_id": self.eos_ids,
            "pad_token_id": self.eos_ids[0] if pad is None else pad,
            "bos_token_id": gen.bos_token_id,
        }
        # Token ids a request may name (prompt, logit_bias): the tokenizer's, that the model has rows for.
        self.vocab_size = min(len(self.tokenizer), int(text.vocab_size))
        self.grammars = GrammarCompiler(self.tokenizer, int(text.vocab_size), self.eos_ids)
        self.token_texts = TokenTexts(self.tokenizer)
        self.tool_marker_ids: frozenset[int] = frozenset()  # special tokens kept in the text (`marker_token_ids`)
        self.adapters = LoraAdapters(self.model) if self.params.lora is not None else None

    def load_adapter(self, name: str, folder: str) -> None:
        if self.adapters is None:
            super().load_adapter(name, folder)
            return
        self.adapters.load(name, folder)

    def unload_adapter(self, name: str) -> None:
        if self.adapters is not None:
            self.adapters.unload(name)

    def require_adapter(self, adapter: str | None) -> None:
        """A request's adapter must be loaded before its sequence starts (a 400 here, not a failed step)."""
        if adapter is not None and (self.adapters is None or adapter not in self.adapters.loaded):
            raise InvalidRequestError(f"The LoRA adapter {adapter!r} is not loaded on this replica.", param="model")

    def lora_rows(self, adapters: list[str | None]) -> contextlib.AbstractContextManager[None]:
        """A forward whose batch rows run these adapters (`lora.LoraAdapters.rows`); nothing without LoRA."""
        return self.adapters.rows(adapters) if self.adapters is not None else contextlib.nullcontext()

    def describe(self) -> dict[str, Any]:
        return {**self.params.model_dump(), **super().describe(), "max_model_len": self.max_model_len}

    def setting(self, request: GenerateRequest, name: str) -> Any:
        """The request's value of a sampling field, or the model's default (`defaults.setting`)."""
        return setting(request, self.params, name)

    def sampling(self, request: GenerateRequest) -> Sampling:
        return Sampling(*(self.setting(request, name) for name in ("temperature", "top_p", "top_k", "min_p")))

    def batch_sampling(self, request: GenerateRequest) -> SamplingParams:
        """The request's sampling as a batch's sampler takes it (continuous and static batching)."""
        sampling = self.sampling(request)
        frequency, presence = self.penalties(request)
        banned, held = self.suppressed(request)
        return SamplingParams(
            sampling.temperature,
            sampling.top_p,
            sampling.top_k,
            sampling.min_p,
            frequency,
            presence,
            request.seed,
            repetition=request.repetition_penalty or 1.0,
            banned=banned,
            held=held,
            held_until=request.min_tokens,
        )

    def suppressed(self, request: GenerateRequest) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """`(banned, held)`: the tokens never chosen (`ignore_eos`: the end of sequence) and those not
        chosen before `min_tokens` tokens (the end of sequence and `stop_token_ids`, as vLLM holds them).
        A stop token id outside the vocabulary is a 400.
        """
        stop_ids = check_token_ids(request.stop_token_ids, self.vocab_size, "stop_token_ids")
        banned = tuple(self.eos_ids) if request.ignore_eos else ()
        held = tuple(dict.fromkeys([*self.eos_ids, *stop_ids])) if request.min_tokens else ()
        return banned, tuple(t for t in held if t not in banned)

    def penalties(self, request: GenerateRequest) -> tuple[float, float]:
        """`(frequency, presence)` OpenAI penalties of the request, or the model's defaults."""
        return self.setting(request, "frequency_penalty"), self.setting(request, "presence_penalty")

    def limits(self, request: GenerateRequest) -> Limits:
        """The request's room in this model's context (`context.Limits`)."""
        return limits(self.max_model_len, request, self.params)

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[EngineOutput, None]:
        stream = await self.start(request)
        keep = self.tool_marker_ids if request.tools else frozenset()
        rules = StopTokens.of(request, self.eos_ids)
        pieces = stream_outputs(stream, self.tokenizer, self.token_texts, keep, self.TEXT, rules)
        async with contextlib.aclosing(pieces) as outputs:
            async for output in outputs:
                yield output

    def tokenize(self, request: TokenizeInput) -> TokenizedPrompt:
        """The prompt's ids (`prompt_ids`); `token_strs` are the vocabulary's strings of them (the
        tokenizer's own, e.g. ``Ġthe``), as vLLM gives them.
        """
        ids, image_tokens = self.prompt_ids(request)
        strs = [str(t) for t in self.tokenizer.convert_ids_to_tokens(ids)] if request.return_token_strs else None
        return TokenizedPrompt(
            tokens=ids, count=len(ids), max_model_len=self.max_model_len, image_tokens=image_tokens, token_strs=strs
        )

    def detokenize(self, tokens: list[int]) -> str:
        return str(self.tokenizer.decode(check_token_ids(tokens, self.vocab_size, "tokens")))

    @abstractmethod
    def prompt_ids(self, request: TokenizeInput) -> tuple[list[int], int]:
        """The prompt's token ids as `start` would prompt with them (never fitted to the context),
        and how many of them are image tokens.
        """

    @abstractmethod
    async def start(self, request: GenerateRequest) -> TokenStream:
        """The request's prompt prepared and checked (errors raise here, before any output); its
        sequence starts when `tokens` is first iterated.
        """

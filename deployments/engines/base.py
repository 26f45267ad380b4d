"""The engine contracts: what the replicas call, and what every engine answers with."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Literal

from PIL import Image

from deployments.config import ToolCallFormat
from deployments.errors import InvalidRequestError
from deployments.protocol.openai.common import TokenLogprob
from deployments.protocol.replica import GenerateRequest, TokenizedPrompt, TokenizeInput


@dataclass(frozen=True)
class EngineOutput:
    """A piece of generated text; `finish_reason` is set on the last piece. Token counts are totals
    so far (text can lag behind tokens while a multi-byte character is incomplete);
    `truncated_prompt_tokens` (on every piece, as `prompt_tokens`: a stop string may end the answer
    before the last one) is what `context_overflow: truncate` dropped from the prompt
    (`prompt_tokens` counts what was kept); `cached_prompt_tokens` (on every piece too) is how many
    prompt tokens came from a prefix cache, None for an engine that has none.
    """

    text: str
    completion_tokens: int = 0
    prompt_tokens: int = 0
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token generated since the last piece, when asked for
    truncated_prompt_tokens: int = 0
    cached_prompt_tokens: int | None = None


class Engine(ABC):  # noqa: B024 - every hook has a default
    """What an engine's slot in a replica (`EngineSlot`) uses, whatever the engine does."""

    device: str | None = None
    """Where the engine computes (``cpu``, ``cuda:0``), for /health; None when it has no device."""

    def describe(self) -> dict[str, Any]:
        """Effective settings, logged once when the engine is loaded."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free device memory (idle unload)."""

    def stats(self) -> dict[str, Any]:
        """Live figures for /health (e.g. sequences running and waiting)."""
        return {}


class TextEngine(Engine):
    """Generates text for a chat. A sampling field the request leaves unset (None) is the model's
    default, and `max_tokens` unset is the model's default cut to the context left: `defaults`
    resolves both, for every engine.
    """

    batch_invariant: bool = False
    """Whether a greedy answer is the same whatever runs beside it (`params.batch_invariant` holds),
    for /health and the effective config; False: no such promise."""

    def prefix_memory(self) -> tuple[int, int, int | None] | None:
        """What the engine keeps of finished prompts for reuse, for the router's reports
        (`routing.HeldPrefixes`): (prompts kept in slots, bytes of a cache beyond them that keeps
        older prompts while they fit, KV bytes a token or None): llama.cpp's host prompt cache, or
        transformers' paged KV cache, which has no slots; None: it keeps none (no prefix cache:
        routing by prefix gains nothing).
        """
        return None

    tool_format: ToolCallFormat = "hermes"
    """How the model writes tool calls (`capabilities.tool_call_format` resolved): the decoder tells
    the ingress with each request that has tools, and the ingress parses the calls with it."""

    @abstractmethod
    def generate(self, request: GenerateRequest) -> AsyncGenerator[EngineOutput, None]:
        """Stream text pieces. Raise ContextLengthError before the first piece when the prompt
        cannot fit; closing the iterator early must stop generation and free its slot.
        """

    def tokenize(self, request: TokenizeInput) -> TokenizedPrompt:
        """The prompt's tokens exactly as `generate` would prompt with the same chat (template, tools,
        images) or text; never fitted to the context (a prompt longer than it is counted whole).
        Blocking; the replica calls it in a worker thread, beside running generations.
        """
        raise InvalidRequestError(f"This model's engine ({type(self).__name__}) does not tokenize.")

    def detokenize(self, tokens: list[int]) -> str:
        """Token ids as text, special tokens included; an id outside the vocabulary is a 400
        (`InvalidRequestError`). Blocking, as `tokenize`.
        """
        raise InvalidRequestError(f"This model's engine ({type(self).__name__}) does not detokenize.")

    def load_adapter(self, name: str, folder: str) -> None:
        """Load the LoRA adapter in local `folder` as `name`, for requests whose `adapter` names it.
        Blocking (the replica calls it in a worker thread). `InvalidRequestError` when the adapter
        cannot be used with this model (naming it); the base and other adapters are left as they were.
        """
        raise InvalidRequestError(f"This model's engine ({type(self).__name__}) takes no LoRA adapters.")

    def unload_adapter(self, name: str) -> None:
        """Drop adapter `name` (no running request uses it: the replica waits for them). Blocking."""

    def failure(self) -> str | None:
        """Why the engine can no longer generate (e.g. its batching thread died), else None."""
        return None


class CaptionEngine(Engine):
    """Turns images into captions, one per (image, prompt) pair, in one batch."""

    @abstractmethod
    def caption(self, images: list[Image.Image], prompts: list[str]) -> list[str]:
        """Blocking; called in a worker thread."""


class EmbedEngine(Engine):
    """Turns texts into token ids and token ids into one vector each, pooled and normalised as its
    entry's `embedding:` section resolves (`pooling`, `normalize` here are the resolved values). The
    replica checks lengths and ids against `max_input_tokens` and `vocab_size` before `embed`.
    """

    dimensions: int
    """The size of the vectors `embed` returns."""
    max_input_tokens: int
    """Most tokens of one input (special tokens included)."""
    vocab_size: int
    """Token ids run from 0 to vocab_size - 1."""
    pooling: str
    normalize: bool

    @abstractmethod
    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids as `embed` takes them (special tokens included), uncut. Blocking."""

    @abstractmethod
    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """One vector per input (each at most `max_input_tokens` ids, all below `vocab_size`), in one
        batch. Blocking; called in a worker thread.
        """

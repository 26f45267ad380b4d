"""The engine contracts and the factory that picks an implementation from a `ModelConfig`."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Literal

from PIL import Image

from deployments.config import ModelConfig, VisionProxyConfig
from deployments.errors import ConfigError
from deployments.protocol import GenerateRequest


@dataclass(frozen=True)
class EngineOutput:
    """A piece of generated text; `finish_reason` is set on the last piece. Token counts are totals
    so far (text can lag behind tokens while a multi-byte character is incomplete)."""

    text: str
    completion_tokens: int = 0
    prompt_tokens: int = 0
    finish_reason: Literal["stop", "length"] | None = None


class TextEngine(ABC):
    """Generates text for a chat. Sampling fields of the request are already resolved."""

    model_name: str

    @abstractmethod
    def generate(self, request: GenerateRequest) -> AsyncGenerator[EngineOutput, None]:
        """Stream text pieces. Raise ContextLengthError before the first piece when the prompt
        cannot fit; closing the iterator early must stop generation and free its slot."""

    def describe(self) -> dict[str, Any]:
        """Effective settings, logged once when the engine is loaded."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free device memory (idle unload)."""

    def failure(self) -> str | None:
        """Why the engine can no longer generate (e.g. its batching thread died), else None."""
        return None

    def stats(self) -> dict[str, Any]:
        """Live figures for /health (e.g. sequences running and waiting)."""
        return {}


class CaptionEngine(ABC):
    """Turns images into captions, one per (image, prompt) pair, in one batch."""

    @abstractmethod
    def caption(self, images: list[Image.Image], prompts: list[str]) -> list[str]:
        """Blocking; called in a worker thread."""

    def describe(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free device memory (idle unload)."""


def _custom_engine(model: ModelConfig, base: type) -> Any:
    """The class named `module:Class` by `model.engine`, checked to implement `base`."""
    module_name, _, class_name = model.engine.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"model {model.name!r}: engine {model.engine!r} cannot be imported: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ConfigError(f"model {model.name!r}: engine {model.engine!r} is not a {base.__name__}")
    return cls


def create_text_engine(model: ModelConfig) -> TextEngine:
    """The decoder engine named by `model.engine` (`transformers` or `module:Class`); for transformers,
    continuous batching unless `params.batching` is `sequential`."""
    if model.engine != "transformers":
        return _custom_engine(model, TextEngine)(model)
    if model.params.batching == "sequential":
        from deployments.engines.hf_text import SequentialTextEngine

        return SequentialTextEngine(model)
    from deployments.engines.hf_batching import ContinuousBatchingTextEngine

    return ContinuousBatchingTextEngine(model)


def create_caption_engine(model: ModelConfig, vision: VisionProxyConfig | None) -> CaptionEngine:
    """The captioner engine named by `model.engine` (`transformers` or `module:Class`)."""
    if model.engine != "transformers":
        return _custom_engine(model, CaptionEngine)(model, vision)
    from deployments.engines.hf_vision import TransformersCaptionEngine

    return TransformersCaptionEngine(model, vision)

"""The engine a `ModelConfig` names: ``transformers`` (the real engines, imported only when chosen,
so that choosing another never imports torch), ``llama.cpp`` (a GGUF file on llama.cpp: a text
decoder, or with its projector file a native vision primary or a captioner; imported only when
chosen), ``fake`` (deterministic, shipped for tests and demos), or
``module:Class`` of your own engine, constructed with the `ModelConfig`.

``auto`` is resolved by the builder from the replica's placement (`deployments/options.py`), so a
replica always gets a named engine. An engine built here directly (tests, scripts) from an entry
still on ``auto`` is resolved as on CPU (`ModelConfig.resolved`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TypeVar

from deployments.config import LLAMA_CPP, TRANSFORMERS, ModelConfig
from deployments.engines.base import CaptionEngine, TextEngine
from deployments.engines.fake import FakeCaptionEngine, FakeTextEngine
from deployments.errors import ConfigError

E = TypeVar("E", TextEngine, CaptionEngine)


def _custom_engine(model: ModelConfig, base: type[E]) -> Callable[[ModelConfig], E]:
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
    """The decoder engine named by `model.engine`: under `vision_mode: native` the engine's VLM
    engine; for transformers otherwise, continuous batching unless `params.batching` is
    `sequential`."""
    model = model.resolved(on_cpu=True)
    if model.engine == "fake":
        return FakeTextEngine(model)
    if model.engine == LLAMA_CPP:
        from deployments.engines.llamacpp import LlamaCppTextEngine, LlamaCppVisionEngine

        native = model.capabilities.vision_mode == "native"
        return LlamaCppVisionEngine(model) if native else LlamaCppTextEngine(model)
    if model.engine != TRANSFORMERS:
        return _custom_engine(model, TextEngine)(model)  # type: ignore[type-abstract]
    if model.capabilities.vision_mode == "native":
        from deployments.engines.transformers.native import NativeVisionEngine

        return NativeVisionEngine(model)
    if model.params.batching == "sequential":
        from deployments.engines.transformers.sequential import SequentialTextEngine

        return SequentialTextEngine(model)
    from deployments.engines.transformers.continuous import ContinuousBatchingTextEngine

    return ContinuousBatchingTextEngine(model)


def create_caption_engine(model: ModelConfig) -> CaptionEngine:
    """The captioner engine named by `model.engine`."""
    model = model.resolved(on_cpu=True)
    if model.engine == "fake":
        return FakeCaptionEngine(model)
    if model.engine == LLAMA_CPP:
        from deployments.engines.llamacpp import LlamaCppCaptionEngine

        return LlamaCppCaptionEngine(model)
    if model.engine != TRANSFORMERS:
        return _custom_engine(model, CaptionEngine)(model)  # type: ignore[type-abstract]
    from deployments.engines.transformers.captioner import TransformersCaptionEngine

    return TransformersCaptionEngine(model)

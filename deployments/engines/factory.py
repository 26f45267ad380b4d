"""The engine a `ModelConfig` names, built by its spec (`registry`): ``transformers`` (the real
engines, imported only when chosen, so that choosing another never imports torch), ``llama.cpp`` (a
GGUF file on llama.cpp: a text decoder, or with its projector file a native vision primary or a
captioner; imported only when chosen), ``fake`` (deterministic, shipped for tests and demos), or
``module:Class`` of your own engine, constructed with the `ModelConfig`.

``auto`` is resolved by the builder from the replica's placement (`deployments/options/`), so a
replica always gets a named engine. An engine built here directly (tests, scripts) from an entry
still on ``auto`` is resolved as on CPU (`registry.resolved`).
"""

from __future__ import annotations

import logging

from deployments.config import ModelConfig
from deployments.engines.base import CaptionEngine, EmbedEngine, TextEngine
from deployments.engines.registry import EngineSpec, check_settings, engine_spec, resolved
from deployments.errors import ConfigError

logger = logging.getLogger("ray.serve")


def _spec(model: ModelConfig) -> tuple[ModelConfig, EngineSpec]:
    """The entry resolved as on CPU, and its engine's spec; a setting it does not read is refused
    (`registry.check_settings`, which the builder asks first).
    """
    entry, model = model, resolved(model, on_cpu=True)
    try:
        check_settings(entry, model.engine)
    except ConfigError as exc:
        raise ConfigError(f"model {model.name!r}: {exc}") from None
    return model, engine_spec(model.engine)


def create_text_engine(model: ModelConfig) -> TextEngine:
    """The decoder engine named by `model.engine` (`EngineSpec.text_engine`): e.g. under `vision_mode:
    native` the engine's VLM engine; for transformers otherwise `params.batching`'s engine (`auto`:
    the static-slot decoder on one CUDA GPU, continuous batching elsewhere).
    """
    model, spec = _spec(model)
    return spec.text_engine(model)


def create_caption_engine(model: ModelConfig) -> CaptionEngine:
    """The captioner engine named by `model.engine` (`EngineSpec.caption_engine`)."""
    model, spec = _spec(model)
    return spec.caption_engine(model)


def create_embed_engine(model: ModelConfig) -> EmbedEngine:
    """The embedding engine named by `model.engine` (`EngineSpec.embed_engine`) for an entry with an
    `embedding:` section; `ConfigError` for an engine that embeds nothing.
    """
    model, spec = _spec(model)
    if spec.embed_engine is None:
        raise ConfigError(f"model {model.name!r}: engine {spec.name!r} serves no embedding models")
    return spec.embed_engine(model)

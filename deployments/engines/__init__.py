"""Model engines behind two small ABCs (`base`); `factory` builds one from a `ModelConfig` by its
spec in `registry` (which also tells the builder how the engine is placed): an engine library's
folder (`transformers/`, `llamacpp/`), the deterministic `fake`, or your own `module:Class`. What every
library shares sits here: the context fitting (`context`), the request batcher (`batcher`) and image
decoding (`images`). Replicas only see `TextEngine` and `CaptionEngine`."""

from deployments.engines.base import CaptionEngine, EmbedEngine, Engine, EngineOutput, TextEngine
from deployments.engines.factory import create_caption_engine, create_embed_engine, create_text_engine

__all__ = [
    "CaptionEngine",
    "EmbedEngine",
    "Engine",
    "EngineOutput",
    "TextEngine",
    "create_caption_engine",
    "create_embed_engine",
    "create_text_engine",
]

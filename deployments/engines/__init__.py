"""Model engines behind the ABCs of `base` (`TextEngine`, `CaptionEngine`, `EmbedEngine`); `factory`
builds one from a `ModelConfig` by its spec in `registry` (which owns the settings each engine reads
and tells the builder how the engine is placed): an engine library's folder (`transformers/`,
`llamacpp/`), the deterministic `fake`, or your own `module:Class`. What every library shares sits
here: a request's defaults and room (`defaults`), the context fitting (`context`), the request
batcher (`batcher`) and image decoding (`images`). Replicas only see the ABCs.

A new engine: a folder beside `transformers/` and `llamacpp/` with its classes on the ABCs, and one
`EngineSpec` in `registry.ENGINES` (its name, constructors, the settings it reads, its placement).
"""

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

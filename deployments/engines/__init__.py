"""Model engines behind two small ABCs; deployments only see `TextEngine` and `CaptionEngine`."""

from deployments.engines.base import (
    CaptionEngine,
    EngineOutput,
    TextEngine,
    create_caption_engine,
    create_text_engine,
)

__all__ = ["CaptionEngine", "EngineOutput", "TextEngine", "create_caption_engine", "create_text_engine"]

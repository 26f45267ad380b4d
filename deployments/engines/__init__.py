"""Model engines behind two small ABCs; deployments only see `TextEngine` and `CaptionEngine`."""

from deployments.engines.base import CaptionEngine, EngineOutput, TextEngine, create_engine

__all__ = ["CaptionEngine", "EngineOutput", "TextEngine", "create_engine"]

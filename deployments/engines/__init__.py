"""Model engines behind two small ABCs (`base`); `factory` picks one from a `ModelConfig`: the
transformers engines (`hf_text`, `hf_batching`, `hf_vision`, with `loading`, `int4_cpu`, and
`constraints`: logprobs, logit bias and JSON grammars per request), the deterministic `fake`, or
your own. Replicas only see `TextEngine` and `CaptionEngine`."""

from deployments.engines.base import CaptionEngine, Engine, EngineOutput, TextEngine
from deployments.engines.factory import create_caption_engine, create_text_engine

__all__ = ["CaptionEngine", "Engine", "EngineOutput", "TextEngine", "create_caption_engine", "create_text_engine"]

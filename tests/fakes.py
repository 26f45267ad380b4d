"""Deterministic fake engines, injected through `engine: tests.fakes:Class` in a test models.yaml."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from PIL import Image

from deployments.config import ModelConfig, VisionProxyConfig
from deployments.engines import CaptionEngine, EngineOutput, TextEngine
from deployments.protocol import GenerateRequest


class EchoEngine(TextEngine):
    """Answers with the prompt it was given (`role: content` lines), one word per piece, so a
    test can read exactly what reached the decoder."""

    def __init__(self, model: ModelConfig) -> None:
        self.model_name = model.name
        self.params = model.params

    async def generate(self, request: GenerateRequest) -> AsyncIterator[EngineOutput]:
        prompt = "\n".join(f"{m.role}: {m.content}" for m in request.messages)
        words = prompt.split(" ")
        limit = request.max_tokens or self.params.max_tokens
        for i, word in enumerate(words[:limit]):
            await asyncio.sleep(0)
            yield EngineOutput(word if i == 0 else " " + word, completion_tokens=i + 1, prompt_tokens=len(words))
        finish = "length" if len(words) > limit else "stop"
        yield EngineOutput("", min(len(words), limit), len(words), finish_reason=finish)


class ColorCaptionEngine(CaptionEngine):
    """Captions an image by its top-left pixel colour; counts its calls."""

    calls = 0

    def __init__(self, model: ModelConfig, vision: VisionProxyConfig | None) -> None:
        self.model = model

    def caption(self, images: list[Image.Image], prompts: list[str]) -> list[str]:
        ColorCaptionEngine.calls += 1
        return [f"a picture whose corner is rgb{img.getpixel((0, 0))}" for img in images]

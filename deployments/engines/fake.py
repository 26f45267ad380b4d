"""Deterministic fake engines, injected through `engine: deployments.engines.fake:Class` in a test models.yaml."""

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


class SlowEngine(TextEngine):
    """Emits " tick" every 20 ms up to max_tokens, and counts its live generations in `stats()`
    (so a test sees, through /health, that a cancelled request stopped generating). The prompt is
    echoed first, so a test can tell which request an answer belongs to."""

    TICK_S = 0.02

    def __init__(self, model: ModelConfig) -> None:
        self.params = model.params
        self.running = 0

    async def generate(self, request: GenerateRequest) -> AsyncIterator[EngineOutput]:
        limit = request.max_tokens or self.params.max_tokens
        self.running += 1
        try:
            yield EngineOutput(request.messages[-1].content, completion_tokens=1, prompt_tokens=1)
            for i in range(2, limit + 1):
                await asyncio.sleep(self.TICK_S)
                yield EngineOutput(" tick", completion_tokens=i, prompt_tokens=1)
            yield EngineOutput("", limit, 1, finish_reason="length")
        finally:
            self.running -= 1

    def stats(self) -> dict[str, int]:
        return {"running": self.running}


class ColorCaptionEngine(CaptionEngine):
    """Captions an image by its top-left pixel colour; counts its calls."""

    calls = 0

    def __init__(self, model: ModelConfig, vision: VisionProxyConfig | None) -> None:
        self.model = model

    def caption(self, images: list[Image.Image], prompts: list[str]) -> list[str]:
        ColorCaptionEngine.calls += 1
        return [f"a picture whose corner is rgb{img.getpixel((0, 0))}" for img in images]

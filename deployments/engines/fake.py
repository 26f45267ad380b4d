"""Deterministic engines for tests and demos (``engine: fake`` in models.yaml), with the same
interface as the real ones, like Ray Serve LLM's mock engine. They load nothing and never import
torch, so a test (or a laptop) can run the whole service in seconds.

- `FakeTextEngine` answers with the prompt it was given (``role: content`` lines), one word per
  token, so a test reads exactly what reached the decoder. `fake.token_delay_ms` waits before each
  token; `fake.fill_to_max_tokens` goes on with `` tick`` tokens up to the length limit (a long,
  slow generation for deadline and overload tests). Its live generations are on /health
  (`stats`: ``running``), so a test sees that a cancelled request stopped generating.
- `FakeCaptionEngine` captions an image by its top-left pixel's colour and repeats the prompt it
  was asked with, so a test sees which request a caption was made for.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any, Literal

from PIL import Image

from deployments.config import ModelConfig
from deployments.engines.base import CaptionEngine, EngineOutput, TextEngine
from deployments.protocol import GenerateRequest

TICK = " tick"


class FakeTextEngine(TextEngine):
    def __init__(self, model: ModelConfig) -> None:
        self.params = model.params
        self.settings = model.fake
        self.running = 0

    def describe(self) -> dict[str, Any]:
        return {"engine": "fake", **self.settings.model_dump()}

    def stats(self) -> dict[str, Any]:
        return {"running": self.running, "waiting": 0}

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[EngineOutput, None]:
        prompt = "\n".join(f"{m.role}: {m.content}" for m in request.messages)
        words = [w if i == 0 else " " + w for i, w in enumerate(prompt.split(" "))]
        limit = request.max_tokens or self.params.max_tokens
        fill = self.settings.fill_to_max_tokens
        pieces = (words + [TICK] * (limit - len(words)) if fill else words)[:limit]
        delay_s = self.settings.token_delay_ms / 1000
        self.running += 1
        try:
            for i, piece in enumerate(pieces, start=1):
                await asyncio.sleep(delay_s)
                yield EngineOutput(piece, completion_tokens=i, prompt_tokens=len(words))
            finish: Literal["stop", "length"] = "length" if fill or len(words) > limit else "stop"
            yield EngineOutput("", len(pieces), len(words), finish_reason=finish)
        finally:
            self.running -= 1


class FakeCaptionEngine(CaptionEngine):
    def __init__(self, model: ModelConfig) -> None:
        self.calls = 0

    def describe(self) -> dict[str, Any]:
        return {"engine": "fake"}

    def caption(self, images: list[Image.Image], prompts: list[str]) -> list[str]:
        self.calls += 1
        return [
            f"a picture whose corner is rgb{img.getpixel((0, 0))} for: {prompt}"
            for img, prompt in zip(images, prompts, strict=True)
        ]

"""The shipped deterministic engines (`engine: fake`): what the Serve tests rely on."""

from __future__ import annotations

import asyncio
import time

from PIL import Image

from deployments.config import FakeEngineConfig, ModelConfig
from deployments.engines import create_caption_engine, create_text_engine
from deployments.protocol import GenerateRequest, TextMessage


def ask(text: str, **kw) -> GenerateRequest:
    return GenerateRequest(messages=[TextMessage(role="user", content=text)], **kw)


async def pieces(engine, request):
    return [p async for p in engine.generate(request)]


async def test_echoes_its_prompt_word_by_word():
    engine = create_text_engine(ModelConfig(name="echo", engine="fake"))
    out = await pieces(engine, ask("tell me a story"))
    assert [p.text for p in out] == ["user:", " tell", " me", " a", " story", ""]
    assert out[-1].finish_reason == "stop" and (out[-1].prompt_tokens, out[-1].completion_tokens) == (5, 5)
    cut = await pieces(engine, ask("tell me a story", max_tokens=2))
    assert "".join(p.text for p in cut) == "user: tell" and cut[-1].finish_reason == "length"


async def test_fills_to_max_tokens_slowly_and_counts_its_live_generations():
    fake = FakeEngineConfig(token_delay_ms=20, fill_to_max_tokens=True)
    engine = create_text_engine(ModelConfig(name="slow", engine="fake", fake=fake))
    started = time.monotonic()
    task = asyncio.ensure_future(pieces(engine, ask("hi", max_tokens=5)))
    await asyncio.sleep(0.03)
    assert engine.stats() == {"running": 1, "waiting": 0}
    out = await task
    assert "".join(p.text for p in out) == "user: hi tick tick tick"
    assert out[-1].finish_reason == "length" and out[-1].completion_tokens == 5
    assert time.monotonic() - started >= 0.1 and engine.stats()["running"] == 0


def test_captions_by_the_top_left_pixel_and_repeats_the_prompt():
    engine = create_caption_engine(ModelConfig(name="cap", engine="fake"))
    images = [Image.new("RGB", (4, 4), (1, 2, 3)), Image.new("RGB", (2, 2), (9, 8, 7))]
    assert engine.caption(images, ["a", "b"]) == [
        "a picture whose corner is rgb(1, 2, 3) for: a",
        "a picture whose corner is rgb(9, 8, 7) for: b",
    ]

"""The native VLM engine on the tiny LLaVA, through the real loading code (no Ray): prompts with
image tokens, per-row limits and sampling inside one batch, the processor cache, and the
load-time memory profile against its budget."""

from __future__ import annotations

import asyncio
import hashlib
import io
from contextlib import aclosing

import pytest
import torch
from PIL import Image

from deployments.config import ModelConfig
from deployments.engines import create_text_engine
from deployments.engines.transformers.native import NativeVisionEngine
from deployments.engines.transformers.processor_cache import ProcessedImage, ProcessorCache
from deployments.errors import ConfigError, ContextLengthError, InvalidRequestError
from deployments.protocol.replica import GenerateRequest, ImageBytes, MessageImage, MessageText, TextMessage


def png(colour: tuple[int, int, int]) -> ImageBytes:
    """A checked image as the ingress sends it: its bytes and their hash."""
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), colour).save(buf, format="PNG")
    return ImageBytes(data=buf.getvalue(), sha256=hashlib.sha256(buf.getvalue()).hexdigest())


def native(tiny_vlm_dir, **params) -> ModelConfig:
    # An idle engine waits batch_wait_ms for company: long enough that requests sent together on a
    # busy 2-core machine (each preparing its image first) still meet in one batch.
    return ModelConfig(
        name="vlm",
        local_path=str(tiny_vlm_dir),
        params={"max_num_seqs": 4, "max_model_len": 128, "batch_wait_ms": 300, **params},
        capabilities={"vision_mode": "native", "max_images_per_request": 2},
    )


@pytest.fixture(scope="module")
def engine(tiny_vlm_dir) -> NativeVisionEngine:
    built = create_text_engine(native(tiny_vlm_dir))
    assert isinstance(built, NativeVisionEngine)
    yield built
    built.close()


def look(*colours: tuple[int, int, int], text: str = "what is it?", **kw) -> GenerateRequest:
    parts = [MessageText(text=text), *(MessageImage(index=i) for i in range(len(colours)))]
    message = TextMessage(role="user", content=text, parts=parts)
    return GenerateRequest(messages=[message], images=[png(c) for c in colours], **{"temperature": 0, **kw})


async def complete(engine: NativeVisionEngine, request: GenerateRequest):
    pieces = [p async for p in engine.generate(request)]
    return "".join(p.text for p in pieces), pieces[-1]


def test_the_prompt_counts_image_tokens(engine):
    one = engine.prompt(look((1, 2, 3)))
    two = engine.prompt(look((1, 2, 3), (4, 5, 6)))
    assert one.image_tokens == 16 and two.image_tokens == 32
    assert two.ids.count(engine.prompts.image_token_id) == 32
    assert len(two.ids) - len(one.ids) == 16 + 1  # the template's newline after the placeholder


def test_an_image_placeholder_typed_as_text_is_a_400(engine):
    with pytest.raises(InvalidRequestError, match="image placeholders"):
        engine.prompt(look((1, 2, 3), text="look: <image>"))
    with pytest.raises(InvalidRequestError):
        engine.prompt(GenerateRequest(prompt="a <image> b"))


async def test_context_overflow_gives_the_numbers(engine):
    with pytest.raises(ContextLengthError, match=r"context is 128 tokens.*\(32 of them image tokens\)"):
        await complete(engine, look((1, 2, 3), (3, 2, 1), max_tokens=100))


async def test_rows_of_one_batch_keep_their_own_length_sampling_and_stream(engine):
    red, blue = look((255, 0, 0), max_tokens=3), look((0, 0, 255), max_tokens=7)
    seeded = look((0, 255, 0), max_tokens=6, temperature=1.0, top_k=20, top_p=0.9, seed=11)
    alone = [await complete(engine, r) for r in (red, blue, seeded)]
    together = await asyncio.gather(*(complete(engine, r) for r in (red, blue, seeded, seeded)))
    assert [t for t, _ in together[:3]] == [t for t, _ in alone] and together[3][0] == together[2][0]
    assert [last.completion_tokens for _, last in together] == [3, 7, 6, 6]
    assert max(engine.batches) >= 2  # rows shared a batch (how many meet depends on the machine's load)


async def test_a_closed_stream_leaves_its_batch_and_the_others_finish(engine):
    async def first_piece_only():
        async with aclosing(engine.generate(look((9, 9, 9), max_tokens=40))) as pieces:
            async for piece in pieces:
                return piece.text

    long = look((8, 8, 8), max_tokens=30)
    cut, (_, last) = await asyncio.gather(first_piece_only(), complete(engine, long))
    assert cut is not None and last.completion_tokens == 30 and last.finish_reason == "length"


def test_processor_cache_is_bounded_least_recently_used_first():
    def entry(n: int) -> ProcessedImage:
        return ProcessedImage(tokens=(1,) * n, aligned={}, tensors={"pixel_values": torch.zeros(n)})

    cache = ProcessorCache(max_bytes=3 * entry(8).nbytes)
    for key in "abc":
        cache.put(key, entry(8))
    assert cache.get("a") is not None  # b is now the least recently used
    cache.put("d", entry(8))
    assert cache.get("b") is None and cache.get("c") is not None
    cache.put("huge", entry(1000))  # larger than the bound: not kept
    assert cache.get("huge") is None
    assert cache.describe()["entries"] == 3 and cache.hits == 2 and cache.misses == 2


def test_the_profile_is_described_and_a_too_small_budget_refuses_to_start(engine, tiny_vlm_dir):
    info = engine.describe()
    assert info["memory_profile_peak_mb"] > 0
    assert info["memory_profile"]["images_per_seq"] == 2 and info["memory_profile"]["seqs"] == 4
    with pytest.raises(ConfigError, match=r"over the budget of 1 MB.*lower params\.max_num_seqs"):
        NativeVisionEngine(native(tiny_vlm_dir, mem_budget_mb=1))


async def test_truncation_drops_old_turns_with_their_images_and_keeps_the_last_image_whole(tiny_vlm_dir):
    truncating = create_text_engine(native(tiny_vlm_dir, context_overflow="truncate", max_model_len=96))
    assert isinstance(truncating, NativeVisionEngine)
    try:

        def turn(text: str, index: int) -> list[TextMessage]:
            asked = TextMessage(role="user", content=text, parts=[MessageText(text=text), MessageImage(index=index)])
            return [asked, TextMessage(role="assistant", content="seen")]

        system = TextMessage(role="system", content="be brief")
        chat = [system, *turn("first", 0), *turn("second", 1), *turn("third", 2)[:1]]
        request = GenerateRequest(
            messages=chat, images=[png((1, 1, 1)), png((2, 2, 2)), png((3, 3, 3))], temperature=0, max_tokens=8
        )
        whole = truncating.prompt(request)  # all three images: over 96 tokens with 8 to generate
        assert whole.image_tokens == 48 and len(whole.ids) + 8 > 96
        _, last = await complete(truncating, request)
        kept = len(whole.ids) - last.truncated_prompt_tokens
        assert last.truncated_prompt_tokens > 0 and last.prompt_tokens == kept
        # What was kept is a real chat of whole turns: the system prompt, the last turn and its image,
        # with every placeholder run complete (16 tokens an image).
        alone = truncating.prompt(request.model_copy(update={"messages": [system, chat[-1]]}))
        with_second = truncating.prompt(request.model_copy(update={"messages": [system, *chat[3:]]}))
        assert kept in {len(alone.ids), len(with_second.ids)}
        assert kept + 8 <= 96
    finally:
        truncating.close()

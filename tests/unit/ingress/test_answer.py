"""The answer core that every endpoint's service frames, on its own with a fake decoder: several
decoder calls read as one answer with its choices numbered across them, each prompt counted once in
the usage, the deadline around a step before the decoder, and the vision pipeline called by no
endpoint at all (as a new endpoint's service would call it)."""

from __future__ import annotations

import asyncio

import pytest

from deployments.errors import RequestTimeoutError
from deployments.ingress.answer.reply import whole
from deployments.ingress.answer.tally import Tally
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.chat import ChatCompletionRequest
from deployments.protocol.replica import BACKGROUND_PRIORITY, GenerateChunk, GenerateRequest
from tests.conftest import data_url, png_bytes
from tests.unit.ingress.fakes import FakeCaptioner, FakeDecoder, answer_core


async def test_several_decoder_calls_are_one_answer_and_each_prompt_counts_once():
    decoder = FakeDecoder(["a", "b"])
    core = answer_core(decoder)
    requests = [GenerateRequest(prompt=p, n=2) for p in ("x", "y")]
    generation = await core.generate(requests, core.deadline(), RequestRecord())
    tally: Tally[str] = Tally(4, per_prompt=2)
    seen: list[int] = []

    def feed(chunk: GenerateChunk) -> None:
        seen.append(chunk.index)
        if chunk.finish_reason is not None:
            tally.end(chunk, chunk.finish_reason)

    await whole(generation, tally, feed)
    assert sorted(set(seen)) == [0, 1, 2, 3] and tally.finished and not tally.cut_short
    usage = tally.usage()
    assert (usage.prompt_tokens, usage.completion_tokens) == (6, 8)


async def test_the_record_counts_every_prompt_and_every_sequence_of_several_calls():
    """What the limits settle and the key's metrics count: the sum over the calls, not the last one's."""
    record = RequestRecord()
    core = answer_core(FakeDecoder(["a", "b", "c"]))
    requests = [GenerateRequest(prompt=p, n=2) for p in ("x", "y", "z")]
    generation = await core.generate(requests, core.deadline(), record)
    tally: Tally[str] = Tally(6, per_prompt=2)

    def feed(chunk: GenerateChunk) -> None:
        if chunk.finish_reason is not None:
            tally.end(chunk, chunk.finish_reason)

    await whole(generation, tally, feed)
    usage = tally.usage()
    assert (record.prompt_tokens, record.completion_tokens) == (usage.prompt_tokens, usage.completion_tokens) == (9, 18)


async def test_the_deadline_cancels_a_step_before_the_decoder_with_a_408():
    deadline = answer_core(FakeDecoder(), request_timeout_s=0.05).deadline()
    with pytest.raises(RequestTimeoutError, match=r"0\.05 s"):
        async with deadline.within():
            await asyncio.sleep(1)


async def test_the_vision_pipeline_serves_any_endpoint_and_says_what_was_not_seen():
    body = ChatCompletionRequest.model_validate(
        {
            "model": "echo",
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(png_bytes())}}]}
            ],
        }
    )
    seen = await answer_core(FakeDecoder(), FakeCaptioner()).vision.prepare(body.messages, RequestRecord())
    assert seen.degraded is None and seen.images == [] and "Image 1:" in seen.messages[0].content
    down = await answer_core(FakeDecoder(), FakeCaptioner(down=True)).vision.prepare(body.messages, RequestRecord())
    assert down.degraded is not None and down.degraded.headers == {"X-Vision-Degraded": "captioner-unavailable"}
    native = await answer_core(FakeDecoder(), native_max_images=2).vision.prepare(body.messages, RequestRecord())
    assert len(native.images) == 1 and native.messages[0].parts is not None


async def read_one(generation) -> None:
    tally: Tally[str] = Tally(1)

    def feed(chunk: GenerateChunk) -> None:
        if chunk.finish_reason is not None:
            tally.end(chunk, chunk.finish_reason)

    await whole(generation, tally, feed)


async def test_a_batch_lines_requests_are_background_work():
    """A batch line (its record names its batch) reaches the decoder at `BACKGROUND_PRIORITY`, or the
    later priority it asked for, never an earlier one; any other request keeps its own."""
    decoder = FakeDecoder(["a"])
    core = answer_core(decoder)
    for asked, batch, sent in [
        (0, None, 0),
        (-5, None, -5),
        (0, "batch_1", 10),
        (-5, "batch_1", 10),
        (99, "batch_1", 99),
    ]:
        generation = await core.generate(
            [GenerateRequest(prompt="x", priority=asked)], core.deadline(), RequestRecord(batch=batch)
        )
        await read_one(generation)
        assert decoder.requests[-1].priority == sent == max(asked, BACKGROUND_PRIORITY if batch else asked)

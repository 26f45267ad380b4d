"""The decoder deployment's own streaming layer (stop strings, stream_interval_ms), on a fake engine
and without Ray: the deployment class is constructed directly."""

import asyncio
import dataclasses
from collections.abc import AsyncGenerator
from contextlib import aclosing

import pytest

from deployments.config import EngineParams, Lifecycle, ModelConfig
from deployments.engines.base import EngineOutput
from deployments.engines.fake import FakeTextEngine
from deployments.protocol.replica import BACKGROUND_PRIORITY, GenerateChunk, GenerateRequest, TextMessage
from deployments.replicas.decoder import PrimaryDecoder
from tests.unit.fake_metrics import FakeMetrics

# The fake engine echoes: it sends "user:", one word of this per piece, then an empty piece with finish_reason.
QUESTION = "tell me a story about a fox that jumps over the dog"


def decoder(stream_interval_ms: float) -> PrimaryDecoder:
    params = EngineParams(stream_interval_ms=stream_interval_ms, max_num_seqs=2)
    model = ModelConfig(name="echo", engine="fake", params=params)
    return PrimaryDecoder.func_or_class(model, Lifecycle())  # type: ignore[attr-defined]


async def chunks(stream_interval_ms: float, **request) -> list[GenerateChunk]:
    ask = GenerateRequest(messages=[TextMessage(role="user", content=QUESTION)], **request)
    return [chunk async for chunk in decoder(stream_interval_ms).generate(ask)]


async def test_without_an_interval_every_piece_is_its_own_chunk():
    sent = await chunks(0)
    assert [c.text for c in sent[:3]] == ["user:", " tell", " me"]
    assert len(sent) == 1 + len(QUESTION.split()) + 1


async def test_every_chunk_carries_the_token_counts_so_far():
    """The ingress may end an answer before its sequence does (a repeated tool call): the counts it
    reports then are those of the last chunk it read."""
    sent = await chunks(0)
    assert [c.completion_tokens for c in sent[:3]] == [1, 2, 3]
    assert {c.prompt_tokens for c in sent} == {sent[-1].prompt_tokens} and sent[-1].prompt_tokens > 0


async def test_an_interval_coalesces_pieces_but_sends_the_first_and_the_last_at_once():
    alone = await chunks(0)
    sent = await chunks(10_000)  # nothing after the first piece is due before the end
    assert [c.text for c in sent] == ["user:", "".join(c.text for c in alone[1:])]
    assert sent[-1].finish_reason == alone[-1].finish_reason == "stop"
    assert (sent[-1].prompt_tokens, sent[-1].completion_tokens) == (
        alone[-1].prompt_tokens,
        alone[-1].completion_tokens,
    )


@pytest.mark.parametrize("stop", [" fox", "ox th", "dog"])
async def test_stop_strings_cut_the_same_text_with_and_without_an_interval(stop):
    alone = "".join(c.text for c in await chunks(0, stop=[stop]))
    coalesced = await chunks(10_000, stop=[stop])
    assert "".join(c.text for c in coalesced) == alone
    assert stop not in alone and alone == ("user: " + QUESTION)[: ("user: " + QUESTION).index(stop)]
    assert coalesced[-1].finish_reason == "stop"


async def test_the_length_limit_ends_a_coalesced_stream_with_its_reason():
    sent = await chunks(10_000, max_tokens=4)
    assert "".join(c.text for c in sent) == "user: tell me a"
    assert sent[-1].finish_reason == "length" and sent[-1].completion_tokens == 4


async def test_each_request_is_recorded_once_finished_or_cancelled():
    replica = decoder(0)
    replica.metrics = metrics = FakeMetrics()
    ask = GenerateRequest(messages=[TextMessage(role="user", content=QUESTION)])
    sent = [chunk async for chunk in replica.generate(ask)]
    async with aclosing(replica.generate(ask)) as stream:
        async for _ in stream:
            break  # the client goes away after the first chunk
    assert metrics.count("request_success", finished_reason="stop") == 1
    assert metrics.count("requests_cancelled") == 1
    assert metrics.count("prompt_tokens") == sent[-1].prompt_tokens * 2  # both were prefilled
    assert metrics.count("generation_tokens") == sent[-1].completion_tokens + 1
    assert [len(metrics.observed[h]) for h in ("request_queue_time_seconds", "time_to_first_token_seconds")] == [2, 2]
    assert [len(metrics.observed[h]) for h in ("e2e_request_latency_seconds", "time_per_output_token_seconds")] == [
        1,
        1,
    ]
    replica._sample()
    assert metrics.gauges["engine_loaded"] == 1 and metrics.gauges["num_requests_running"] == 0


async def test_n_sequences_come_back_tagged_and_each_one_finishes():
    replica = decoder(0)
    ask = GenerateRequest(messages=[TextMessage(role="user", content=QUESTION)], n=3)
    sent = [chunk async for chunk in replica.generate(ask)]
    alone = await chunks(0)
    for index in range(3):
        mine = [c for c in sent if c.index == index]
        assert "".join(c.text for c in mine) == "".join(c.text for c in alone)
        assert [c.finish_reason for c in mine if c.finish_reason] == ["stop"]


async def test_closing_an_n_stream_frees_every_sequence():
    replica = decoder(0)
    replica.metrics = metrics = FakeMetrics()
    ask = GenerateRequest(messages=[TextMessage(role="user", content=QUESTION)], n=2)
    async with aclosing(replica.generate(ask)) as stream:
        async for _ in stream:
            break
    assert metrics.count("requests_cancelled") == 2
    assert replica._seqs.reserved == 0  # both slots back


async def test_health_counts_the_sequences_waiting_for_a_slot():
    """Three sequences on two slots: two in the engine's batch, one waiting in the replica, which
    the engine never sees; /health's `waiting` says so, as the num_requests_waiting gauge does."""
    fake = {"token_delay_ms": 20, "fill_to_max_tokens": True}
    model = ModelConfig(name="echo", engine="fake", params=EngineParams(max_num_seqs=2, max_tokens=1000), fake=fake)
    replica = PrimaryDecoder.func_or_class(model, Lifecycle())  # type: ignore[attr-defined]
    replica.metrics = metrics = FakeMetrics()
    ask = GenerateRequest(messages=[TextMessage(role="user", content=QUESTION)], n=3)
    async with aclosing(replica.generate(ask)) as stream:
        async for _ in stream:
            break
        details = replica.status().details
        replica._sample()
    assert (details["running"], details["waiting"]) == (2, 1)
    assert metrics.gauges["num_requests_waiting"] == 1
    assert (replica.status().details["running"], replica.status().details["waiting"]) == (0, 0)


@pytest.mark.parametrize("invariant", [False, True])
def test_health_says_whether_greedy_answers_are_batch_invariant(invariant):
    model = ModelConfig(name="echo", engine="fake", params=EngineParams(batch_invariant=invariant))
    replica = PrimaryDecoder.func_or_class(model, Lifecycle())  # type: ignore[attr-defined]
    assert replica.status().details["batch_invariant"] is invariant


async def test_a_stop_string_keeps_the_count_of_prompt_tokens_truncation_dropped():
    """`context_overflow: truncate` drops the first turn (6 words) to leave room for 4 tokens in 12;
    the stop string ends the answer before the engine's last piece, and usage still says so."""
    params = EngineParams(max_model_len=12, context_overflow="truncate", max_tokens=4)
    replica = PrimaryDecoder.func_or_class(ModelConfig(name="echo", engine="fake", params=params), Lifecycle())  # type: ignore[attr-defined]
    turns = [("user", "one two three four"), ("assistant", "five six"), ("user", "say abc")]
    ask = GenerateRequest(messages=[TextMessage(role=r, content=c) for r, c in turns], stop=["abc"])
    sent = [chunk async for chunk in replica.generate(ask)]
    assert "".join(c.text for c in sent) == "user: say "
    assert (sent[-1].finish_reason, sent[-1].prompt_tokens, sent[-1].truncated_prompt_tokens) == ("stop", 3, 6)


class PrefixCachingEcho(FakeTextEngine):
    """The echo engine, saying on its last piece that all its prompt but one token came from a cache."""

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[EngineOutput, None]:
        async for piece in super().generate(request):
            cached = piece.prompt_tokens - 1 if piece.finish_reason else None
            yield dataclasses.replace(piece, cached_prompt_tokens=cached)


async def test_cached_prompt_tokens_reach_the_last_chunk_and_their_counter():
    model = ModelConfig(name="echo", engine=f"{__name__}:PrefixCachingEcho")
    replica = PrimaryDecoder.func_or_class(model, Lifecycle())  # type: ignore[attr-defined]
    replica.metrics = metrics = FakeMetrics()
    sent = [
        chunk async for chunk in replica.generate(GenerateRequest(messages=[TextMessage(role="user", content="hi")]))
    ]
    assert sent[-1].cached_prompt_tokens == sent[-1].prompt_tokens - 1 > 0
    assert metrics.count("prompt_tokens_cached") == sent[-1].cached_prompt_tokens


async def test_min_tokens_lets_no_stop_string_end_the_text_before_it():
    """vLLM's min_tokens: " a" first ends the 4th token (" a"); with min_tokens 6, the 6th (" about")."""
    assert "".join(c.text for c in await chunks(0, stop=[" a"])) == "user: tell me"
    held = await chunks(0, stop=[" a"], min_tokens=6)
    assert "".join(c.text for c in held) == "user: tell me a story"
    assert held[-1].finish_reason == "stop" and held[-1].stop_sequence == " a"


async def test_include_stop_str_in_output_keeps_the_stop_string():
    for interval in (0, 10_000):
        sent = await chunks(interval, stop=["ox th"], include_stop_str_in_output=True)
        assert "".join(c.text for c in sent) == "user: tell me a story about a fox th"


async def test_waiting_sequences_are_admitted_by_priority_then_in_arrival_order():
    fake = {"token_delay_ms": 5, "fill_to_max_tokens": True}
    model = ModelConfig(name="echo", engine="fake", params=EngineParams(max_num_seqs=1, max_tokens=50), fake=fake)
    replica = PrimaryDecoder.func_or_class(model, Lifecycle())  # type: ignore[attr-defined]
    admitted: list[str] = []

    async def first_chunk(name: str, priority: int) -> None:
        ask = GenerateRequest(messages=[TextMessage(role="user", content=name)], priority=priority, max_tokens=2)
        async with aclosing(replica.generate(ask)) as stream:
            async for _ in stream:
                admitted.append(name)
                break

    running = GenerateRequest(messages=[TextMessage(role="user", content=QUESTION)])
    async with aclosing(replica.generate(running)) as stream:
        await anext(stream)  # the one slot is taken
        tasks = [asyncio.create_task(first_chunk(name, p)) for name, p in [("b", 0), ("c", 1), ("a", -1), ("d", 0)]]
        while replica._seqs.waiting < 4:
            await asyncio.sleep(0.001)
    await asyncio.gather(*tasks)
    assert admitted == ["a", "b", "d", "c"]


async def test_batch_lines_wait_while_an_interactive_request_runs():
    """Background work (batch lines) takes the slots an interactive request leaves only once the
    replica is quiet: every running sequence slows each step."""
    fake = {"token_delay_ms": 5, "fill_to_max_tokens": True}
    model = ModelConfig(name="echo", engine="fake", params=EngineParams(max_num_seqs=8, max_tokens=400), fake=fake)
    replica = PrimaryDecoder.func_or_class(model, Lifecycle())  # type: ignore[attr-defined]
    started: list[int] = []
    done = asyncio.Event()

    async def line(i: int) -> None:
        ask = GenerateRequest(messages=[TextMessage(role="user", content=f"line {i}")], priority=BACKGROUND_PRIORITY)
        async with aclosing(replica.generate(ask)) as stream:
            await anext(stream)
            started.append(i)
            await done.wait()  # the line keeps its sequence

    chat = GenerateRequest(messages=[TextMessage(role="user", content=QUESTION)])
    async with aclosing(replica.generate(chat)) as stream:
        await anext(stream)  # an interactive request is running
        lines = [asyncio.create_task(line(i)) for i in range(3)]
        for _ in range(500):  # until the lines have settled: without the gate all three start at once
            if replica._seqs.waiting == 3 or started:
                break
            await asyncio.sleep(0.01)
        assert replica._seqs.waiting == 3 and started == []  # 7 slots free, and every line waits
    for _ in range(1000):  # once the replica is quiet, they all run
        if len(started) == 3:
            break
        await asyncio.sleep(0.01)
    assert sorted(started) == [0, 1, 2]
    done.set()
    await asyncio.gather(*lines)

"""The static-slot engine through the engine ABC (`TextEngine.generate`), as the decoder replica
drives it: stop strings close the stream, max_tokens ends it, a closed stream frees its slot, more
requests than slots wait for one; and `batching: auto` keeps continuous batching on a CPU."""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing

import pytest

from deployments.config import EngineParams, ModelConfig
from deployments.engines import create_text_engine
from deployments.engines.transformers.continuous import ContinuousBatchingTextEngine
from deployments.engines.transformers.static.engine import StaticTextEngine
from deployments.protocol.replica import GenerateRequest, TextMessage
from deployments.replicas.stopping import StopMatcher


def ask(text: str, **kw) -> GenerateRequest:
    return GenerateRequest(messages=[TextMessage(role="user", content=text)], **kw)


@pytest.fixture(scope="module")
def engine(tiny_llm_dir):
    params = EngineParams(batching="static", max_num_seqs=2)
    built = create_text_engine(ModelConfig(name="tiny", local_path=str(tiny_llm_dir), params=params))
    assert isinstance(built, StaticTextEngine)
    yield built
    built.close()


async def idle(engine: StaticTextEngine) -> dict:
    deadline = time.monotonic() + 30
    while (stats := engine.stats())["running"] + stats["waiting"] and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return engine.stats()


async def text_of(engine, request) -> tuple[str, list]:
    pieces = [p async for p in engine.generate(request)]
    return "".join(p.text for p in pieces), pieces


def test_auto_keeps_continuous_batching_on_a_cpu(tiny_llm_dir):
    built = create_text_engine(ModelConfig(name="tiny", local_path=str(tiny_llm_dir), params=EngineParams()))
    try:
        assert EngineParams().batching == "auto"
        assert isinstance(built, ContinuousBatchingTextEngine)
    finally:
        built.close()


async def test_max_tokens_ends_the_stream_with_length(engine):
    text, pieces = await text_of(engine, ask("count", temperature=0, max_tokens=7))
    assert text and pieces[-1].finish_reason == "length" and pieces[-1].completion_tokens == 7
    assert [p.finish_reason for p in pieces[:-1]] == [None] * (len(pieces) - 1)
    assert (await idle(engine))["running"] == 0


async def test_a_stop_string_closes_the_stream_and_frees_the_slot(engine):
    """As the decoder replica does: the text is cut at a stop string taken from the greedy answer,
    and the stream is closed there; the slot is free at once for the next requests."""
    full, _ = await text_of(engine, ask("tell a story", temperature=0, max_tokens=30))
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    matcher = StopMatcher([stop])
    kept = ""
    async with aclosing(engine.generate(ask("tell a story", temperature=0, max_tokens=300))) as pieces:
        async for piece in pieces:
            kept += matcher.feed(piece.text)
            if matcher.stopped:
                break
    assert matcher.stopped and kept == full[: full.index(stop)]
    assert (await idle(engine))["running"] == 0
    again, _ = await text_of(engine, ask("tell a story", temperature=0, max_tokens=30))
    assert again == full


async def test_more_requests_than_slots_wait_and_all_answer_as_alone(engine):
    prompts = [f"item {i} is " * (i + 1) for i in range(5)]
    alone = [(await text_of(engine, ask(p, temperature=0, max_tokens=9)))[0] for p in prompts]
    together = await asyncio.gather(*(text_of(engine, ask(p, temperature=0, max_tokens=9)) for p in prompts))
    assert [t for t, _ in together] == alone
    assert await idle(engine) == {"running": 0, "waiting": 0, "kv_cache_usage": 0.0}


async def test_cancelled_streams_free_their_slots(engine):
    """Both slots taken by streams closed after their first piece, and a third waiting: all come
    free, and the engine still answers."""

    async def first_piece(prompt: str) -> None:
        async with aclosing(engine.generate(ask(prompt, temperature=0, max_tokens=400))) as pieces:
            async for _ in pieces:
                return

    await asyncio.gather(*(first_piece(f"go on {i}") for i in range(3)))
    assert await idle(engine) == {"running": 0, "waiting": 0, "kv_cache_usage": 0.0}
    assert engine.failure() is None
    text, _ = await text_of(engine, ask("still there?", temperature=0, max_tokens=4))
    assert text


def test_the_effective_config_names_the_buckets_and_graphs(engine):
    info = engine.describe()
    assert info["batching"] == "static" and info["attention"] == "static slots"
    assert info["batch_buckets"] == [1, 2] and info["graphs"] == 0 and info["capture_s"] == 0.0
    assert info["kv_cache_mb"] > 0 and info["slot_len"] == engine.max_model_len


@pytest.mark.parametrize("keep_markers", [False, True])
def test_windowed_detokenization_gives_the_whole_sequences_text(tiny_llm_dir, keep_markers):
    """Fed one token at a time, the windowed text's pieces join to the text of the whole sequence
    decoded at once (multi-byte characters split across tokens held back, leading spaces kept),
    as `IncrementalText`'s do, with and without kept special tokens."""
    from transformers import AutoTokenizer

    from deployments.engines.transformers.stream import IncrementalText, WindowedText

    tokenizer = AutoTokenizer.from_pretrained(tiny_llm_dir)
    text = "Hello  wörld — 東京 is 🌧️ today.\n  Indented <|im_end|> after, ünïcödé ✓ and 😀😀 end"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    keep = frozenset({tokenizer.convert_tokens_to_ids("<|im_end|>")}) if keep_markers else frozenset()
    windowed, whole = WindowedText(tokenizer, keep), IncrementalText(tokenizer, keep)
    pieces = [windowed.feed([i]) for i in ids] + [windowed.flush()]
    reference = [whole.feed([i]) for i in ids] + [whole.flush()]
    assert "".join(pieces) == "".join(reference)
    assert all("\ufffd" not in p for p in pieces)
    assert len([p for p in pieces if p]) > len(ids) // 2  # streamed, not all at the end


class RecordingTokenizer:
    """A tokenizer that records how many ids each decode was given."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.lengths = tokenizer, []

    def decode(self, ids, **kw):
        self.lengths.append(len(ids))
        return self.tokenizer.decode(ids, **kw)


def test_windowed_detokenization_decodes_a_short_window_per_token(tiny_llm_dir):
    """Each token costs decodes of a few ids, however long the answer (the whole-sequence decode
    grows with it: quadratic work over an answer)."""
    from transformers import AutoTokenizer

    from deployments.engines.transformers.stream import WindowedText

    tokenizer = RecordingTokenizer(AutoTokenizer.from_pretrained(tiny_llm_dir))
    ids = tokenizer.tokenizer(" and then the story went on" * 30, add_special_tokens=False).input_ids
    windowed = WindowedText(tokenizer)
    for i in ids:
        windowed.feed([i])
    assert len(ids) > 150 and max(tokenizer.lengths) <= 4

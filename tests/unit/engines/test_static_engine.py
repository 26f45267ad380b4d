"""The static-slot engine through the engine ABC (`TextEngine.generate`), as the decoder replica
drives it: stop strings close the stream, max_tokens ends it, a closed stream frees its slot, more
requests than slots wait for one; `batching: auto` keeps continuous batching on a CPU. A slot keeps
its last prompt: a next turn reuses it (usage's cached tokens) and answers as an engine without
reuse does, a prompt reuses only what it shares, the least recently used slot goes first, and a
cancelled sequence leaves only what it wrote.
"""

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


@pytest.fixture(scope="module")
def cold(tiny_llm_dir):
    """The same engine with slot reuse off: every prompt computed whole."""
    params = EngineParams(batching="static", max_num_seqs=2, enable_prefix_caching=False)
    built = create_text_engine(ModelConfig(name="tiny", local_path=str(tiny_llm_dir), params=params))
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


def ids_prompt(first: int, n: int = 60, **kw) -> GenerateRequest:
    """A legacy completion prompt of `n` token ids from `first` on (no chat template shared with
    other prompts), greedy and 8 tokens unless `kw` says otherwise."""
    return GenerateRequest(prompt=list(range(first, first + n)), **{"temperature": 0, "max_tokens": 8, **kw})


def cached(pieces: list) -> int | None:
    counts = {p.cached_prompt_tokens for p in pieces}
    assert len(counts) == 1  # every piece says it
    return counts.pop()


async def test_a_next_turn_reuses_the_slot_of_the_last_and_answers_as_without_reuse(engine, cold):
    first = [TextMessage(role="user", content="Here is a long story about the sea and its ships. " * 6)]
    answer, pieces = await text_of(engine, GenerateRequest(messages=first, temperature=0, max_tokens=12))
    assert cached(pieces) is not None
    second = [*first, TextMessage(role="assistant", content=answer), TextMessage(role="user", content="And then?")]
    request = GenerateRequest(messages=second, temperature=0, max_tokens=12)
    warm, pieces = await text_of(engine, request)
    before, now = engine.chat_ids(first, None), engine.chat_ids(second, None)
    assert now[: len(before)] == before
    assert len(before) <= cached(pieces) < len(now)  # the first turn's prompt at least, and its answer's tokens
    again, cold_pieces = await text_of(cold, request)
    assert warm == again and cached(cold_pieces) is None and cold.prefix_memory() is None
    assert engine.prefix_memory() == (2, 0, engine.kv_bytes_per_token)


async def test_a_prompt_reuses_only_what_it_shares_with_a_slot(engine, cold):
    """Half a prompt shared: that half reused; a prompt with nothing in common: nothing; the same
    prompt again: all but its last token (whose logits give the first new token)."""
    await text_of(engine, ids_prompt(1000))
    half = GenerateRequest(prompt=[*range(1000, 1030), *range(2000, 2030)], temperature=0, max_tokens=8)
    shared, pieces = await text_of(engine, half)
    assert cached(pieces) == 30 and shared == (await text_of(cold, half))[0]
    _, pieces = await text_of(engine, ids_prompt(3000))
    assert cached(pieces) == 0
    _, pieces = await text_of(engine, ids_prompt(3000))
    assert cached(pieces) == 59


async def test_a_seeded_request_is_computed_whole(engine):
    """As on llama.cpp: its answer must not depend on what ran before it."""
    await text_of(engine, ids_prompt(4000))
    _, pieces = await text_of(engine, ids_prompt(4000, seed=3, temperature=1.0))
    assert cached(pieces) == 0


async def test_the_least_recently_used_slot_goes_first(engine):
    """Two slots, three prompts one after another: the third takes the first's slot, so the second's
    prefix is still there (with the lowest free slot first, each would have taken slot 0)."""
    for first in (5000, 6000, 7000):
        await text_of(engine, ids_prompt(first))
    _, pieces = await text_of(engine, ids_prompt(6000))
    assert cached(pieces) == 59
    _, pieces = await text_of(engine, ids_prompt(5000))
    assert cached(pieces) == 0


async def test_a_cancelled_sequence_leaves_only_what_it_wrote(engine, cold):
    """A stream closed after its third token: its slot holds its prompt and the tokens that a decode
    step wrote. A prompt that continues exactly those reuses them all and answers as without reuse,
    to the logprobs (a token held whose K/V was never written would change them)."""
    async with aclosing(engine.generate(ids_prompt(8000, max_tokens=400))) as pieces:
        async for piece in pieces:
            if piece.completion_tokens >= 3:
                break
    await idle(engine)
    prompt = list(range(8000, 8060))
    held = max((engine._slots.held(slot) for slot in range(2)), key=lambda ids: shared_prefix(ids, prompt))
    assert held[:60] == prompt and 62 <= len(held) < 60 + 400  # tokens 1 and 2 at least went through a decode step
    follow = GenerateRequest(prompt=[*held, 8100, 8101], temperature=0, max_tokens=10, logprobs=0)
    warm, pieces = await text_of(engine, follow)
    assert cached(pieces) == len(held)
    again, cold_pieces = await text_of(cold, follow)
    logprobs = [t.logprob for p in pieces for t in p.logprobs]
    assert warm == again and logprobs == pytest.approx([t.logprob for p in cold_pieces for t in p.logprobs], abs=1e-4)


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n

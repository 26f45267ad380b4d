"""`engine: llama.cpp` alone, on the offline default GGUF (SmolLM2-135M-Instruct Q4_1): streaming,
sampling per request in one batch, cancellation, the prompt and its context, constrained JSON."""

import asyncio
import ctypes
import json
import logging
import re
import signal
import subprocess
import sys
import time
from contextlib import aclosing
from pathlib import Path

import jsonschema
import pytest
from pydantic import ValidationError

from deployments.config import EngineParams, Lifecycle, ModelConfig, cpu_cores, load_models_file
from deployments.engines import create_caption_engine, create_text_engine
from deployments.engines.llamacpp import LlamaCppTextEngine
from deployments.engines.llamacpp.gguf_meta import describe_gguf
from deployments.engines.llamacpp.kv_cache import kv_layout
from deployments.engines.llamacpp.server import LlamaServer, ServerSettings
from deployments.engines.llamacpp.settings import llama_threads
from deployments.errors import ConfigError, ContextLengthError, DecoderUnavailable, InvalidRequestError
from deployments.protocol.replica import GenerateRequest, GrammarSpec, TextMessage
from deployments.replicas.lifecycle import EngineSlot

QUESTION = "What is the capital of France?"
ROOT = Path(__file__).resolve().parents[3]


def llamacpp_model(gguf: Path, engine: str = "llama.cpp", **params) -> ModelConfig:
    settings = {"max_num_seqs": 4, "max_model_len": 512, "temperature": 0, "cpu_threads": 2, **params}
    return ModelConfig(
        name="smollm2", engine=engine, local_path=str(gguf.parent), weight_file=gguf.name, params=settings
    )


@pytest.fixture(scope="module")
def engine(smollm2) -> LlamaCppTextEngine:
    built = create_text_engine(llamacpp_model(smollm2))
    assert isinstance(built, LlamaCppTextEngine)
    yield built
    built.close()


def ask(text: str = QUESTION, **kw) -> GenerateRequest:
    return GenerateRequest(messages=[TextMessage(role="user", content=text)], **kw)


async def complete(engine, request: GenerateRequest):
    pieces = [p async for p in engine.generate(request)]
    return "".join(p.text for p in pieces), pieces


def slots_processing(engine: LlamaCppTextEngine) -> int:
    """What llama.cpp itself says: slots that are processing a task."""
    return sum(bool(slot["is_processing"]) for slot in engine._server.call("/slots"))


# --------------------------------------------------------------------------- streaming and sampling


async def test_streams_token_deltas_with_counts(engine):
    request = ask(max_tokens=12)
    text, pieces = await complete(engine, request)
    assert len(pieces) > 3 and text
    counts = [p.completion_tokens for p in pieces]
    assert counts == sorted(counts) and counts[0] >= 1
    last = pieces[-1]
    assert last.finish_reason == "length" and last.completion_tokens == 12
    assert all(p.finish_reason is None for p in pieces[:-1])
    assert {p.prompt_tokens for p in pieces} == {len(engine.chat_ids(request.messages))}


async def test_finish_reason_stop_at_end_of_sequence(engine):
    _, pieces = await complete(engine, ask("Say hi.", max_tokens=200))
    assert pieces[-1].finish_reason == "stop" and pieces[-1].completion_tokens < 200


async def test_a_repeated_prompt_reuses_its_prefix_and_a_seeded_one_is_computed_whole(engine):
    request = ask("Name three rivers.", max_tokens=8)
    _, cold = await complete(engine, request)
    _, warm = await complete(engine, request)
    prompt = cold[-1].prompt_tokens
    assert warm[-1].prompt_tokens == prompt
    # llama.cpp computes at least the prompt's last token again, to have its logits
    assert 0 < warm[-1].cached_prompt_tokens < prompt
    assert {p.cached_prompt_tokens for p in warm} == {warm[-1].cached_prompt_tokens}  # every piece says it
    seeded = request.model_copy(update={"seed": 7, "max_tokens": 24})
    first_text, first = await complete(engine, seeded)
    second_text, second = await complete(engine, seeded)
    assert first[-1].cached_prompt_tokens == second[-1].cached_prompt_tokens == 0
    assert first_text == second_text and first_text


async def test_without_prefix_caching_no_prompt_token_is_reused(smollm2):
    engine = create_text_engine(llamacpp_model(smollm2, enable_prefix_caching=False, max_num_seqs=1))
    try:
        for _ in range(2):
            _, pieces = await complete(engine, ask(max_tokens=2))
            assert pieces[-1].cached_prompt_tokens == 0
    finally:
        engine.close()


async def test_seed_gives_the_same_answer_alone_and_beside_other_requests(engine):
    request = ask("Write a short story about a dog.", temperature=1.0, seed=1234, max_tokens=24)
    alone, _ = await complete(engine, request)
    other_seed, _ = await complete(engine, request.model_copy(update={"seed": 4321}))
    assert other_seed != alone

    started = asyncio.Event()
    counter = [0]

    async def neighbour(i: int) -> None:
        neighbour_request = ask(f"Tell me about cat number {i}.", temperature=1.0, seed=i, max_tokens=48)
        async with aclosing(engine.generate(neighbour_request)) as pieces:
            async for _ in pieces:
                counter[0] += 1
                if counter[0] >= 3:
                    started.set()

    neighbours = [asyncio.create_task(neighbour(i)) for i in range(3)]
    await asyncio.wait_for(started.wait(), 60)
    assert engine.stats()["running"] >= 1
    beside, _ = await complete(engine, request)
    await asyncio.gather(*neighbours)
    assert beside == alone


async def test_min_p_1_is_greedy_at_any_temperature(engine):
    greedy, _ = await complete(engine, ask("Name a colour.", max_tokens=12))
    sampled = [
        await complete(engine, ask("Name a colour.", temperature=1.5, min_p=1.0, max_tokens=12, seed=i))
        for i in range(2)
    ]
    assert [text for text, _ in sampled] == [greedy] * 2


async def test_penalties_and_logit_bias_change_the_answer(engine):
    plain, _ = await complete(engine, ask(max_tokens=30))
    penalized, _ = await complete(engine, ask(max_tokens=30, presence_penalty=2.0, frequency_penalty=1.0))
    assert penalized != plain
    comma = engine.text_ids(",")
    assert len(comma) == 1
    biased, _ = await complete(engine, ask(max_tokens=5, logit_bias={comma[0]: 100.0}))
    assert biased == ",,,,,"
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        await complete(engine, ask(max_tokens=5, logit_bias={10**7: 1.0}))


async def test_logprobs_one_per_token_with_sorted_alternatives(engine):
    _, pieces = await complete(engine, ask(max_tokens=10, logprobs=3))
    logprobs = [lp for p in pieces for lp in p.logprobs]
    assert len(logprobs) == pieces[-1].completion_tokens == 10
    for lp in logprobs:
        assert lp.logprob <= 0 and len(lp.top_logprobs) == 3
        values = [t.logprob for t in lp.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert lp.top_logprobs[0].token == lp.token  # greedy: the chosen token is the most likely
        assert bytes(lp.bytes).decode(errors="replace")
    _, pieces = await complete(engine, ask(max_tokens=4, logprobs=0))
    assert all(lp.top_logprobs == [] for p in pieces for lp in p.logprobs)
    _, pieces = await complete(engine, ask(max_tokens=4))
    assert all(p.logprobs == () for p in pieces)


# --------------------------------------------------------------------------- cancellation and stats


async def test_closing_streams_frees_their_slots_at_once(engine):
    streams = [engine.generate(ask(f"Count to one thousand, number {i}.", max_tokens=400)) for i in range(4)]
    for stream in streams:
        await anext(stream)
        await anext(stream)
    assert engine.stats()["running"] == 4
    assert slots_processing(engine) == 4
    closed_at = time.monotonic()
    for stream in streams:
        await stream.aclose()
    assert engine.stats() == {
        "running": 0,
        "waiting": 0,
        "kv_cache_usage": 0.0,
        "prompt_cache_mb": engine.prompt_cache_mib,
    }
    while slots_processing(engine) and time.monotonic() - closed_at < 5:
        await asyncio.sleep(0.02)
    assert slots_processing(engine) == 0
    assert time.monotonic() - closed_at < 2  # one decode step, not the 400 tokens asked for
    # The slots take new requests, all four at once.
    answers = await asyncio.gather(*(complete(engine, ask(max_tokens=4)) for _ in range(4)))
    assert all(pieces[-1].finish_reason == "length" for _, pieces in answers)


async def test_stats_while_running(engine):
    async with aclosing(engine.generate(ask(max_tokens=100))) as stream:
        first = await anext(stream)
        stats = engine.stats()
        assert stats["running"] == 1 and stats["waiting"] == 0
        assert stats["kv_cache_usage"] == pytest.approx(
            (first.prompt_tokens + first.completion_tokens) / engine.kv_cells, abs=5 / engine.kv_cells
        )


# --------------------------------------------------------------------------- the prompt and its context


async def test_legacy_prompt_text_and_token_ids(engine):
    text_answer, pieces = await complete(engine, GenerateRequest(prompt="The capital of France is", max_tokens=6))
    ids = engine.text_ids("The capital of France is")
    assert pieces[-1].prompt_tokens == len(ids)
    ids_answer, _ = await complete(engine, GenerateRequest(prompt=ids, max_tokens=6))
    assert ids_answer == text_answer
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        await complete(engine, GenerateRequest(prompt=[1, 10**7], max_tokens=2))


async def test_context_overflow_is_a_400_with_the_numbers(engine):
    long = ask("word " * 600)
    prompt = len(engine.chat_ids(long.messages))
    with pytest.raises(ContextLengthError, match=f"context is 512 tokens; the prompt has {prompt}"):
        await complete(engine, long)
    with pytest.raises(ContextLengthError, match="500 completion tokens were requested"):
        await complete(engine, ask(max_tokens=500))


async def test_truncate_drops_whole_oldest_turns(smollm2):
    engine = create_text_engine(
        llamacpp_model(smollm2, max_num_seqs=1, max_model_len=256, max_tokens=32, context_overflow="truncate")
    )
    try:
        system = TextMessage(role="system", content="You are terse.")
        turns = []
        for i in range(4):
            turns.append(TextMessage(role="user", content=f"Question {i}: " + "tell me more " * 15))
            turns.append(TextMessage(role="assistant", content=f"Answer {i}: " + "here it is " * 8))
        last = TextMessage(role="user", content="And the capital of France?")
        chat = [system, *turns, last]
        assert len(engine.chat_ids(chat)) + 32 > 256
        _, pieces = await complete(engine, GenerateRequest(messages=chat))
        final = pieces[-1]
        assert final.truncated_prompt_tokens > 0
        assert final.prompt_tokens + 32 <= 256 and final.completion_tokens <= 32
        # The kept chat is the system message and the newest whole turns that fit, nothing cut.
        kept = {len(engine.chat_ids([system, *turns[2 * n :], last])): n for n in range(5)}
        assert final.prompt_tokens in kept
        dropped = kept[final.prompt_tokens]
        assert dropped > 0
        assert len(engine.chat_ids([system, *turns[2 * (dropped - 1) :], last])) + 32 > 256  # one turn more: too long
        assert final.truncated_prompt_tokens == len(engine.chat_ids(chat)) - final.prompt_tokens
    finally:
        engine.close()


async def test_tools_without_template_syntax_take_the_generic_format(engine):
    """SmolLM2's template never reads `tools`: the definitions go into the system message in the
    generic format, which the ingress then parses."""
    tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}
    assert engine.supports_tools is False and engine.tool_format == "generic"
    chat = [TextMessage(role="user", content=QUESTION)]
    with_tools = engine.chat_ids(chat, [tool])
    rendered = engine._server.call("/detokenize", {"tokens": with_tools})["content"]
    assert '"name": "weather"' in rendered and "JSON list of calls" in rendered
    assert len(with_tools) > len(engine.chat_ids(chat))
    _, pieces = await complete(engine, ask(tools=[tool], max_tokens=8))
    assert pieces[-1].finish_reason in ("stop", "length") and pieces[-1].prompt_tokens == len(with_tools)


# --------------------------------------------------------------------------- constrained JSON


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "pet": {"enum": ["cat", "dog", "none"]},
    },
    "required": ["name", "age", "pet"],
    "additionalProperties": False,
}


async def test_json_schema_output_parses_and_validates(engine):
    grammar = GrammarSpec(kind="json_schema", json_schema=json.dumps(PERSON))
    text, pieces = await complete(engine, ask("Describe a person as JSON.", max_tokens=80, grammar=grammar))
    assert pieces[-1].finish_reason == "stop"
    jsonschema.validate(json.loads(text), PERSON)
    text, _ = await complete(
        engine, ask("Give me a person as JSON.", max_tokens=60, grammar=GrammarSpec(kind="json_object"))
    )
    assert text.lstrip().startswith("{")


async def test_invalid_json_schema_is_a_400(engine):
    grammar = GrammarSpec(kind="json_schema", json_schema=json.dumps({"type": "objekt"}))
    with pytest.raises(InvalidRequestError, match="objekt"):
        await complete(engine, ask(max_tokens=5, grammar=grammar))


# --------------------------------------------------------------------------- life cycle and settings


def _handler(signum: int) -> int | None:
    """The C-level handler of a signal (what the kernel calls), not Python's record of it."""
    buffer = (ctypes.c_ubyte * 256)()
    assert ctypes.CDLL(None).sigaction(signum, None, ctypes.byref(buffer)) == 0
    return ctypes.c_void_p.from_buffer(buffer).value


def test_signal_handlers_are_left_alone_and_close_frees_the_engine(smollm2):
    """llama-server's main installs SIGINT/SIGTERM handlers; in a replica they would swallow Ray's
    SIGTERM. The pinned xllamacpp does not install them: checked here, so a new version that
    does is noticed."""
    before = {s: _handler(s) for s in (signal.SIGINT, signal.SIGTERM)}
    engine = create_text_engine(llamacpp_model(smollm2, max_num_seqs=1))
    assert {s: _handler(s) for s in before} == before
    assert engine.failure() is None
    engine.close()
    assert engine.failure() is not None
    with pytest.raises(DecoderUnavailable):
        asyncio.run(complete(engine, ask(max_tokens=2)))


def test_describe_and_settings(engine):
    described = engine.describe()
    assert described["engine"] == "llama.cpp" and described["slots"] == 4
    assert described["max_model_len"] == 512 and described["kv_cache_tokens"] == 4 * 512
    assert described["kv_unified"] is False and described["cpu_threads"] == described["cpu_threads_batch"] == 2
    assert described["kv_cache_type"] == "f16" and described["batch_invariant"] is False  # speed by default
    assert described["vocab_size"] == 49152


def test_gguf_header(smollm2):
    shape = describe_gguf(smollm2)
    assert (shape.architecture, shape.context_length, shape.layers, shape.vocab_size) == ("llama", 8192, 30, 49152)
    assert shape.kv_bytes_per_token() == 2 * 30 * 3 * (64 + 64)  # f16 K and V, 3 KV heads of 64
    assert shape.kv_bytes_per_token("q8_0") == 30 * 3 * (64 + 64) * 34 // 32  # blocks of 32 in 34 bytes


def test_kv_layout():
    per_token = 23040
    assert kv_layout(EngineParams(max_num_seqs=16), 8192, per_token) == (16 * 8192, False)
    # 512 MB is less than 16 streams of 8192: one pool the slots share.
    assert kv_layout(EngineParams(max_num_seqs=16, mem=512), 8192, per_token) == (512 * 2**20 // per_token, True)
    assert kv_layout(EngineParams(max_num_seqs=2, mem=4096), 8192, per_token) == (2 * 8192, False)
    assert kv_layout(EngineParams(max_num_seqs=16, mem=1), 8192, per_token) == (8192, True)


def test_config_needs_a_gguf_and_a_captioner_its_projector(smollm2):
    with pytest.raises(ValueError, match="exactly one of hf_id and local_path"):
        ModelConfig(name="x", engine="llama.cpp")
    with pytest.raises(ConfigError, match="set mmproj_file"):
        create_caption_engine(llamacpp_model(smollm2))
    with pytest.raises(ConfigError, match="needs a GGUF file"):
        create_text_engine(ModelConfig(name="x", engine="llama.cpp", local_path=str(smollm2.parent)))


def test_an_engine_built_from_an_entry_on_auto_is_llama_cpp_for_a_gguf(smollm2):
    """Outside the builder (which resolves `auto` from the placement), `auto` is resolved as for a
    decoder on CPU."""
    engine = create_text_engine(llamacpp_model(smollm2, engine="auto", max_num_seqs=1))
    try:
        assert isinstance(engine, LlamaCppTextEngine)
    finally:
        engine.close()


def test_the_load_logs_its_steps_with_time_and_bytes(smollm2, caplog):
    """As the transformers engines: source, download, load, done, under `loading decoder '<name>'`."""
    logger = logging.getLogger("ray.serve")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="ray.serve"):
            create_text_engine(llamacpp_model(smollm2, max_num_seqs=2)).close()
    finally:
        logger.removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loading ")]
    size = f"{smollm2.stat().st_size / 1e6:.1f} MB"
    patterns = [
        rf"source local GGUF {re.escape(str(smollm2))} \({size}\)",
        rf"step=download \d+\.\d s \(local, {size} on disk\)",
        r"step=load \d+\.\d s \(llama.cpp server in this process: llama GGUF as it is, 2 slots, 1024 KV cells, "
        r"\d+\.\d MB \(512 per slot\), f16 cells, 2 threads \(2 for batched steps\), "
        r"a prompt cache of up to 1024 MiB in host memory; "
        r"greedy answers may change with the load\)",
        r"done in \d+\.\d s \(rss \d+\.\d [MG]B\)",
    ]
    assert len(lines) == len(patterns), lines
    for pattern, line in zip(patterns, lines, strict=True):
        assert re.fullmatch(rf"loading decoder 'smollm2': {pattern}", line), (pattern, line)


def test_loading_and_answering_never_imports_torch(smollm2):
    """A llama.cpp decoder's process stays free of torch and transformers (seconds and hundreds of MB)."""
    code = f"""
import asyncio, json, sys
from deployments.replicas.decoder import PrimaryDecoder
from deployments.engines import create_text_engine
from tests.unit.engines.test_llamacpp import ask, complete, llamacpp_model
from pathlib import Path
engine = create_text_engine(llamacpp_model(Path({str(smollm2)!r}), max_num_seqs=1))
text, _ = asyncio.run(complete(engine, ask(max_tokens=4)))
print(json.dumps([bool(text), sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(done.stdout.splitlines()[-1]) == [True, []]


async def test_an_idle_engine_is_unloaded_and_reloaded_by_the_next_request(smollm2):
    """`idle_unload_s`: the slot closes the llama.cpp server, and the next request starts a new one
    in the same process, which answers as the first did."""
    slot = EngineSlot(
        "decoder",
        "smollm2",
        lambda: create_text_engine(llamacpp_model(smollm2, max_num_seqs=1)),
        unavailable=DecoderUnavailable,
        lifecycle=Lifecycle(idle_unload_s=0.3),
    )
    assert slot.load()
    async with slot.use() as first:
        before, _ = await complete(first, ask(max_tokens=8))
    slot.start(tick_s=0.05)
    try:
        deadline = time.monotonic() + 10
        while slot.state != "unloaded" and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert slot.state == "unloaded" and slot.engine is None and first.failure() is not None
        async with slot.use() as second:
            assert second is not first and slot.state == "ready"
            after, _ = await complete(second, ask(max_tokens=8))
        assert after == before and slot.status().details["running"] == 0
    finally:
        slot.stop()
        if slot.engine is not None:
            slot.engine.close()


async def test_a_batch_larger_than_the_shared_pool_waits_instead_of_failing(smollm2):
    """Four slots share one pool of about 1,000 cells; four requests of about 250 prompt tokens and
    200 new tokens each need twice that: two run, the others wait for their cells, and none fails
    (without the reservation llama.cpp failed all four: "Context size has been exceeded")."""
    shape = describe_gguf(smollm2)
    per_token = shape.kv_bytes_per_token("f16")  # the cells' type on auto
    assert per_token
    mem = 1000 * per_token // 2**20 + 1
    engine = create_text_engine(llamacpp_model(smollm2, mem=mem, max_model_len=600, enable_prefix_caching=False))
    assert isinstance(engine, LlamaCppTextEngine) and engine.kv_unified and engine.kv_cells < 1200
    try:
        long = " ".join(f"word{i}" for i in range(75))
        requests = [ask(f"{i} {long}", max_tokens=200, temperature=1.0, seed=i, logit_bias={2: -100}) for i in range(4)]
        answers = await asyncio.gather(*(complete(engine, r) for r in requests))
        assert all(pieces[-1].finish_reason == "length" for _, pieces in answers)  # EOS is biased away
        assert all(200 <= pieces[-1].prompt_tokens <= 300 for _, pieces in answers), [p[-1] for _, p in answers]
    finally:
        engine.close()


async def test_with_batch_invariant_a_greedy_answer_is_the_same_alone_and_beside_sampled_requests(smollm2):
    """models.yaml's first entry with `batch_invariant: true` (q8_0 cells, a stream per slot): three
    greedy prompts (a short one; about 100 tokens,
    which f16 cells prefill with the tiled attention kernel alone; about 560 tokens, whose decode steps
    alone take the split-KV kernel on f16 cells) in three rounds beside seven sampled requests. On the
    shared f16 pool this engine shipped before, 6 of 9 such checks drifted (docs/reliability.md, "Greedy answers
    and the batch")."""
    from scripts.bench.greedy import GREEDY_PROMPTS, drift, filler

    shipped = load_models_file(ROOT / "models.yaml").models[0]
    invariant = shipped.params.model_copy(update={"batch_invariant": True})
    model = shipped.model_copy(
        update={"local_path": str(smollm2.parent), "weight_file": smollm2.name, "params": invariant}
    )
    engine = create_text_engine(model)
    assert isinstance(engine, LlamaCppTextEngine) and engine.batch_invariant and engine.kv_cache_type == "q8_0"
    try:
        greedy = (GREEDY_PROMPTS[0], GREEDY_PROMPTS[1][:500], GREEDY_PROMPTS[2][:3000])
        sampled = [f"Tell me a story about {filler(20 + i, 5 + 12 * i)}" for i in range(7)]
        drifted = await drift(engine, greedy, sampled, rounds=3, greedy_tokens=16, sampled_tokens=(8, 24))
        assert drifted == []
    finally:
        engine.close()


async def test_on_the_offline_default_greedy_answers_end_instead_of_looping_to_max_tokens(smollm2):
    """models.yaml's first entry as it ships: greedy alone, this 135M model loops on these prompts
    ("1. 1. 1. ..."; "la femme au martyre, ...") until max_tokens; its frequency_penalty ends them
    (docs/benchmarks.md, "The offline default's answers")."""
    shipped = load_models_file(ROOT / "models.yaml").models[0]
    model = shipped.model_copy(update={"local_path": str(smollm2.parent), "weight_file": smollm2.name})
    engine = create_text_engine(model)
    try:
        for prompt in ("Count from 1 to 3.", QUESTION):
            text, pieces = await complete(engine, ask(prompt))
            assert pieces[-1].finish_reason == "stop", (prompt, text)
    finally:
        engine.close()


async def test_long_prompts_enter_prefill_first_come_first_served(smollm2):
    """With 64 prompt tokens of prefill budget, of three ~200-token prompts sent at once the later
    two wait (free slots notwithstanding) until the one before has its first token; all three answer."""
    engine = create_text_engine(llamacpp_model(smollm2, prefill_chunk_size=64))
    assert isinstance(engine, LlamaCppTextEngine)
    firsts: list[int] = []

    async def one(i: int) -> str:
        text = ""
        async for piece in engine.generate(ask(f"{i} " + "tell me about rivers and stones " * 30, max_tokens=4)):
            if i not in firsts:
                firsts.append(i)
            text += piece.text
        return text

    try:
        tasks = []
        for i in range(3):
            tasks.append(asyncio.create_task(one(i)))
            await asyncio.sleep(0.3)  # arrival order 0, 1, 2
        waited = 0
        while not all(t.done() for t in tasks):
            stats = engine.stats()
            if stats["running"] < 3 and stats["waiting"] > 0:
                waited += 1
            await asyncio.sleep(0.05)
        await asyncio.gather(*tasks)
        assert waited > 0  # the four slots had room: only the prefill budget held them
        assert firsts == [0, 1, 2]
    finally:
        engine.close()


def test_batch_invariant_is_refused_where_it_cannot_hold(smollm2):
    """q8_0 cells in a stream per slot, or nothing: f16 cells (the attention's kernel follows the batch's
    shape) and a shared pool (`mem` below the slots' contexts: cells out of order) are refused, each
    naming what to change."""
    with pytest.raises(ValidationError, match="batch_invariant needs q8_0 KV cells"):
        llamacpp_model(smollm2, batch_invariant=True, kv_cache_dtype="f16")
    with pytest.raises(ConfigError, match=r"batch_invariant needs a stream of KV cells per slot, and mem: 1 MB"):
        create_text_engine(llamacpp_model(smollm2, batch_invariant=True, mem=1))


def test_batch_invariant_is_refused_with_lora_adapters(smollm2, tmp_path):
    """Rows of one adapter batched together are not invariant on llama.cpp (docs/lora.md): three
    greedy requests for one random adapter at once answered differently from alone. Refused at build."""
    from scripts.bench.lora_adapters import build_gguf_lora

    lora = build_gguf_lora(smollm2, tmp_path / "x.gguf", seed=1)
    with pytest.raises(ValidationError, match=r"batch_invariant cannot hold with lora: llama\.cpp batches"):
        llamacpp_model(smollm2, batch_invariant=True, lora={"adapters": {"x": str(lora)}})
    assert llamacpp_model(smollm2, lora={"adapters": {"x": str(lora)}}).params.lora is not None


def test_one_token_steps_and_batched_steps_take_their_own_threads(smollm2, monkeypatch):
    """cpu_threads for one-token steps, cpu_threads_batch for batched ones: the settings llama.cpp gets
    (its -t and -tb), the engine's effective config and its load line say both."""
    import deployments.engines.llamacpp.engine as engine_module

    given: list[ServerSettings] = []
    server_class = engine_module.LlamaServer

    def recording(settings: ServerSettings) -> LlamaServer:
        given.append(settings)
        return server_class(settings)

    monkeypatch.setattr(engine_module, "LlamaServer", recording)
    built = create_text_engine(llamacpp_model(smollm2, cpu_threads=1, cpu_threads_batch="all", max_num_seqs=2))
    try:
        assert (given[0].threads, given[0].threads_batch) == (1, cpu_cores())
        described = built.describe()
        assert (described["cpu_threads"], described["cpu_threads_batch"]) == (1, cpu_cores())
        assert asyncio.run(complete(built, ask(max_tokens=2)))[1][-1].finish_reason is not None
    finally:
        built.close()
    assert llama_threads(EngineParams(cpu_threads=3)) == (3, 3)  # unset: as cpu_threads
    assert llama_threads(EngineParams(cpu_threads=1, cpu_threads_batch=4)) == (1, 4)

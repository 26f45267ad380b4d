"""The llama.cpp engine behind real Ray Serve, driven by the official openai client, as a GGUF on CPU
gets it by default (no `engine:`, no replica count: `engine: auto` and one replica with every core):
/health, whole and streamed answers with usage, stop strings, max_completion_tokens, n, logprobs,
logit_bias, a seed's answer beside other requests, eight concurrent streams in one replica's batch,
structured output, the legacy endpoint, the context's 400 and `context_overflow: truncate`, tools
(tools' other cases on this engine: test_tools.py's `smol`), sixteen streams with /health still
answering, the deadline, the replica's metrics, idle unload and reload with the load's progress
lines, and a replica that exits cleanly when Ray terminates or kills it (and is replaced).

One deployment for the module (a llama.cpp replica loads in seconds, but each costs a replica's
start): its settings serve every test, and the tests run in file order (idle unload, then the
replica kills, last)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest
import ray

from tests.serve.conftest import (
    BASE_URL,
    Samples,
    decoder_details,
    decoder_sequences,
    deploy,
    gone,
    metric_total,
    open_streams,
    replica_log_lines,
    replica_pids,
    scrape_metrics,
    settled_metrics,
    undeploy,
    wait_until,
    write_models,
)

MODEL = "smollm2-llamacpp"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
# Answers compared across requests carry a seed: a seeded request is computed whole, never from a
# cached prefix (whose other batch shape can change the last bits of the logits, and a greedy token).
WHOLE = {"seed": 1}
MAX_MODEL_LEN = 1024
SLOTS = 8
DEADLINE_S = 30  # server.request_timeout_s
IDLE_S = 8  # idle_unload_s: longer than any pause between this module's requests but the idle test's
END, COMMA = 2, 28  # SmolLM2's <|im_end|> and "," token ids
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(serve_cluster, tmp_path_factory, smollm2):
    models = write_models(
        tmp_path_factory.mktemp("llamacpp"),
        [
            {
                "name": MODEL,
                "local_path": str(smollm2.parent),
                "weight_file": smollm2.name,
                "params": {
                    "max_tokens": 32,
                    "max_num_seqs": SLOTS,
                    "max_model_len": MAX_MODEL_LEN,
                    "temperature": 0,
                    "stream_interval_ms": 0,
                    "context_overflow": "truncate",
                },
            }
        ],
        idle_unload_s=IDLE_S,
        server={"request_timeout_s": DEADLINE_S, "max_n": 2 * SLOTS},
    )
    deploy(models, decoder_gpus=0)  # on CPU: llama.cpp, one replica (every stream in its batch)
    yield openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key="unused", max_retries=0, timeout=120)
    pids = replica_pids("default", "PrimaryDecoder")
    undeploy("default", "vision")
    assert wait_until(lambda: all(map(gone, pids)), 30), "a decoder replica outlived Serve's delete"


def streamed(client: openai.OpenAI, **request) -> tuple[str, str | None, object, list]:
    """A streamed answer's text, finish reason, usage and chunks."""
    text, finish, usage, chunks = "", None, None, []
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **request):
        chunks.append(chunk)
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            assert finish is None or choice.finish_reason is None  # exactly one finish reason
            finish = choice.finish_reason or finish
    return text, finish, usage, chunks


def endless(content: str, **fields: object) -> dict:
    """A chat request that generates to its max_tokens (the end-of-turn token banned): longer than
    the deadline when sixteen run on these 8 slots."""
    ask = [{"role": "user", "content": content}]
    return {"model": MODEL, "messages": ask, "max_tokens": 900, "logit_bias": {str(END): -100}, **fields}


def streams(count: int) -> contextlib.AbstractContextManager[None]:
    """`count` endless streams at once; inside the block every slot is taken (or every stream runs)."""
    bodies = [endless(f"Tell me a long story about the number {i}.", stream=True) for i in range(count)]
    return open_streams(bodies, started=min(count, SLOTS))


def test_a_gguf_on_cpu_runs_on_llama_cpp_in_one_replica_and_health_shows_its_sequences(client):
    """/health names the engine, and while a stream runs, its sequence and the KV cells it holds
    (what the decoder's metrics num_requests_running and kv_cache_usage_perc are sampled from)."""
    assert len(replica_pids("default", "PrimaryDecoder")) == 1
    details = decoder_details()
    assert (details["engine"], details["device"], details["running"], details["waiting"]) == ("llama.cpp", "cpu", 0, 0)
    stream = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=400, stream=True)
    with contextlib.closing(stream):
        next(c for c in stream if c.choices and c.choices[0].delta.content)
        running = decoder_details()
    assert running["running"] == 1 and running["kv_cache_usage"] > 0
    assert wait_until(lambda: decoder_details()["running"] == 0, 10)  # the closed stream freed its slot


def test_tools_on_a_template_without_tool_syntax_take_the_generic_format(client):
    """SmolLM2's template never reads `tools`: the generic format carries them, and a forced call
    (`tool_choice: required`) is constrained to a call of the request's tool, whole and streamed."""
    parameters = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
    tool = {"type": "function", "function": {"name": "weather", "parameters": parameters}}
    ask = {"model": MODEL, "messages": ASK, "tools": [tool], "tool_choice": "required", "max_tokens": 32, **WHOLE}
    whole = client.chat.completions.create(**ask)
    calls = whole.choices[0].message.tool_calls
    assert whole.choices[0].finish_reason == "tool_calls" and calls and calls[0].function.name == "weather"
    assert set(json.loads(calls[0].function.arguments)) == {"city"}
    deltas = [c.choices[0].delta for c in client.chat.completions.create(**ask, stream=True) if c.choices]
    streamed = [call for d in deltas for call in d.tool_calls or []]
    assert streamed and streamed[0].function.name == "weather"
    assert "".join(call.function.arguments or "" for call in streamed) == calls[0].function.arguments


def test_whole_and_streamed_answers_with_usage(client):
    whole = client.chat.completions.create(model=MODEL, messages=ASK, **WHOLE)
    answer = whole.choices[0].message.content
    assert answer and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 32
    assert whole.usage.prompt_tokens > 10
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    text, finish, usage, chunks = streamed(client, model=MODEL, messages=ASK, **WHOLE)
    assert (text, finish) == (answer, "length")  # greedy: the stream is the whole answer
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len(chunks) > 10 and chunks[-1].choices == []
    assert (usage.prompt_tokens, usage.completion_tokens) == (whole.usage.prompt_tokens, 32)


def test_stop_strings_cut_the_answer(client):
    answer = client.chat.completions.create(model=MODEL, messages=ASK, **WHOLE).choices[0].message.content
    words = answer.split()
    assert len(words) > 3, answer
    stop = words[2]
    cut = client.chat.completions.create(model=MODEL, messages=ASK, stop=[stop], **WHOLE)
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == answer[: answer.index(stop)]
    assert cut.usage.completion_tokens < 32
    text, finish, _, _ = streamed(client, model=MODEL, messages=ASK, stop=[stop], **WHOLE)
    assert (text, finish) == (cut.choices[0].message.content, "stop")


def test_a_repeated_prompt_reads_its_prefix_from_the_cache(client):
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "Name a river."}], "max_tokens": 2}
    first, second = (client.chat.completions.create(**ask).usage for _ in range(2))
    assert second.prompt_tokens == first.prompt_tokens
    assert 0 < second.prompt_tokens_details.cached_tokens < second.prompt_tokens
    seeded = client.chat.completions.create(**ask, seed=3).usage
    assert seeded.prompt_tokens_details.cached_tokens == 0


def test_n_choices_with_a_seed(client):
    request = {"model": MODEL, "messages": ASK, "n": 2, "temperature": 1.0, "seed": 7, "max_tokens": 16}
    reply = client.chat.completions.create(**request)
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.choices[0].message.content != reply.choices[1].message.content  # seeds 7 and 8
    assert 2 <= reply.usage.completion_tokens <= 32
    again = client.chat.completions.create(**request)
    assert [c.message.content for c in again.choices] == [c.message.content for c in reply.choices]


def test_eight_concurrent_streams(client):
    """Eight streams at once in the one replica's batch: every one has its first token before any
    has finished (one after another, the last would start when the others are done)."""

    def one(i: int) -> tuple[str, str | None, object, float, float]:
        first = None
        text, finish, usage = "", None, None
        stream = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Tell me a story about the number {i}."}],
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                if choice.delta.content and first is None:
                    first = time.monotonic()
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        return text, finish, usage, first or float("inf"), time.monotonic()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    for text, finish, usage, _, _ in results:
        assert text and finish in ("stop", "length")
        assert usage.completion_tokens == 32 or finish == "stop"
    assert len({r[0] for r in results}) > 1
    assert max(r[3] for r in results) < min(r[4] for r in results)


def test_json_schema_json_object_and_legacy_completions(client):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Invent a person. Answer in JSON with name and age."}],
        max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    )
    jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)
    ask = 'Give a JSON object with a key "city" naming the capital of France.'
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": ask}], response_format={"type": "json_object"}
    )
    assert reply.choices[0].finish_reason == "stop" and isinstance(json.loads(reply.choices[0].message.content), dict)
    legacy = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, logprobs=2)
    assert legacy.choices[0].text and legacy.usage.completion_tokens == 6
    assert len(legacy.choices[0].logprobs.tokens) == 6


def test_a_prompt_beyond_the_context_is_a_400(client):
    """Under `context_overflow: truncate` too: the last turn alone does not fit."""
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 1200}])
    assert err.value.code == "context_length_exceeded"
    assert f"context is {MAX_MODEL_LEN} tokens; the prompt has 12" in err.value.body["message"]


def test_a_long_chat_drops_its_oldest_turns_to_fit(client):
    """`context_overflow: truncate`: four turns of about 120 tokens and a question leave no room for
    the 600 completion tokens asked for in 1024; the oldest turn goes, and the answer and usage are
    those of the chat without it, whole and streamed (usage says how many prompt tokens went)."""
    messages = []
    for i in range(4):
        messages += [{"role": "user", "content": f"{i}. " + "Tell me about rivers. " * 20}]
        messages += [{"role": "assistant", "content": "Rivers flow to the sea."}]
    ask = {"model": MODEL, "messages": [*messages, *ASK], "max_tokens": 600, "stop": ["."]}
    whole = client.chat.completions.create(**ask)
    dropped = whole.usage.model_extra["truncated_prompt_tokens"]
    shorter = client.chat.completions.create(**{**ask, "messages": ask["messages"][2:]})
    kept = shorter.usage.prompt_tokens
    assert whole.usage.prompt_tokens == kept <= MAX_MODEL_LEN - 600 < kept + dropped
    assert whole.choices[0].message.content == shorter.choices[0].message.content
    text, _, usage, _ = streamed(client, **ask)
    assert (text, usage.model_extra["truncated_prompt_tokens"]) == (whole.choices[0].message.content, dropped)


def test_max_completion_tokens_wins_over_max_tokens(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=20, max_completion_tokens=5)
    assert (reply.choices[0].finish_reason, reply.usage.completion_tokens) == ("length", 5)


def test_logprobs_with_alternatives_streamed_as_whole(client):
    """One entry per completion token, the chosen token the most likely (greedy), alternatives
    sorted; the stream carries the same tokens and values."""
    request = {"model": MODEL, "messages": ASK, "logprobs": True, "top_logprobs": 3, "max_tokens": 12}
    whole = client.chat.completions.create(**request)
    tokens = whole.choices[0].logprobs.content
    assert len(tokens) == whole.usage.completion_tokens == 12
    assert "".join(t.token for t in tokens) == whole.choices[0].message.content
    for token in tokens:
        values = [alt.logprob for alt in token.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True) and token.logprob <= 0
        assert token.top_logprobs[0].token == token.token
        assert token.top_logprobs[0].logprob == pytest.approx(token.logprob)
    chunks = streamed(client, **request)[3]
    logprobs = [t for c in chunks for choice in c.choices if choice.logprobs for t in choice.logprobs.content or []]
    assert [(t.token, t.logprob) for t in logprobs] == [(t.token, t.logprob) for t in tokens]


def test_logit_bias_forces_a_token_and_checks_the_vocabulary(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=5, logit_bias={str(COMMA): 100}, logprobs=True
    )
    assert reply.choices[0].message.content == ",,,,,"
    assert {t.token for t in reply.choices[0].logprobs.content} == {","}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ASK, logit_bias={"10000000": 1})
    assert err.value.body["param"] == "logit_bias" and "outside the vocabulary" in err.value.body["message"]


def test_a_seed_answers_the_same_alone_and_in_a_full_batch(client):
    """llama.cpp samples each slot with its own seeded generator: the seeded request answers the same
    alone and as the eighth sequence beside seven others."""
    seeded = {"model": MODEL, "messages": ASK, "temperature": 1.0, "seed": 1234, "max_tokens": 24}
    alone = client.chat.completions.create(**seeded).choices[0].message.content
    with streams(SLOTS - 1):
        beside = client.chat.completions.create(**seeded).choices[0].message.content
    assert beside == alone
    assert client.chat.completions.create(**{**seeded, "seed": 1235}).choices[0].message.content != alone


def test_health_and_the_api_answer_while_sixteen_streams_fill_the_replica(client):
    """c16 on 8 slots: 8 sequences decode on every core the replica has, 8 more wait in it, and its
    max_ongoing_requests (16) are all taken. Serve's proxy and the ingress still answer /health (from
    Serve's view of the decoder when the replica cannot take its status call in time) and
    /v1/models; closing the streams frees every slot."""
    with streams(16):
        health = httpx.get(f"{BASE_URL}/health", timeout=60)
        assert health.status_code == 200, health.text
        assert health.json()["status"] == "ok" and health.json()["components"]["decoder"]["ready"]
        assert [m.id for m in client.models.list().data] == [MODEL]


def test_a_request_past_its_deadline_is_a_408_and_frees_its_slots(client):
    """n=16 endless sequences on 8 slots: 8 decode and 8 wait, as /health and the replica's gauges
    say. 16 x 900 tokens take minutes on a 2-core CPU, so the deadline ends the request: a 408, and
    each sequence is cancelled, its slot freed at once. (A CPU decoding this model at more than about
    480 tokens/s in a batch of 8 would finish within the deadline.) The metrics count it all."""

    def batch(samples: Samples) -> tuple[float, float]:
        return metric_total(samples, "num_requests_running"), metric_total(samples, "num_requests_waiting")

    before = scrape_metrics(MODEL)
    with ThreadPoolExecutor(1) as pool:
        body = endless(ASK[0]["content"], n=2 * SLOTS)
        reply = pool.submit(httpx.post, f"{BASE_URL}/v1/chat/completions", json=body, timeout=DEADLINE_S + 60)
        assert wait_until(lambda: decoder_sequences() == (SLOTS, SLOTS), 20), decoder_sequences()
        during = settled_metrics((MODEL,), lambda s: batch(s) == (SLOTS, SLOTS), DEADLINE_S)
        assert batch(during) == (SLOTS, SLOTS) and metric_total(during, "kv_cache_usage_perc") > 0
        assert metric_total(during, "engine_loaded", role="decoder") == 1  # (idle unload may follow the 408)
        response = reply.result()
    assert response.status_code == 408, response.text
    assert response.json()["error"]["code"] == "request_timeout"
    assert wait_until(lambda: decoder_sequences() == (0, 0), 15), decoder_sequences()

    def counted(samples: Samples) -> bool:
        cancelled = metric_total(samples, "requests_cancelled") - metric_total(before, "requests_cancelled")
        return cancelled >= 2 * SLOTS and batch(samples) == (0, 0)

    after = settled_metrics((MODEL,), counted, 30)
    assert counted(after)
    first_tokens = metric_total(after, "time_to_first_token_seconds", "_count")
    assert first_tokens >= metric_total(before, "time_to_first_token_seconds", "_count") + SLOTS
    for counter in ("prompt_tokens", "generation_tokens"):
        assert metric_total(after, counter) > metric_total(before, counter), counter


def test_an_idle_model_is_unloaded_and_the_next_request_loads_it_again(client):
    """`idle_unload_s`: after IDLE_S without a request the replica closes its llama.cpp server (its
    memory goes back); /health stays ok. The next request loads it again, with the load's progress
    lines logged again, and answers as before."""

    def load_steps() -> list[str]:
        lines = replica_log_lines("PrimaryDecoder", f"loading decoder {MODEL!r}: ", app="default")
        return [line.split(f"loading decoder {MODEL!r}: ")[1].split(" ")[0] for line in lines]

    answer = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8).choices[0].message.content
    loaded, steps = decoder_details(), load_steps()
    assert wait_until(lambda: decoder_details()["state"] == "unloaded", IDLE_S + 20)
    health = httpx.get(f"{BASE_URL}/health", timeout=30).json()
    assert health["status"] == "ok" and health["components"]["decoder"]["details"]["rss_mb"] < loaded["rss_mb"] - 100
    assert replica_log_lines("PrimaryDecoder", f"decoder {MODEL!r} unloaded after {IDLE_S}s idle", app="default")
    again = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8).choices[0].message.content
    assert again == answer and decoder_details()["state"] == "ready"
    reloaded = [*steps, "source", "step=download", "step=load", "done"]
    assert wait_until(lambda: load_steps() == reloaded, 10), load_steps()


@pytest.mark.parametrize("how", ["SIGTERM", "ray.kill"])
def test_a_replica_exits_cleanly_and_is_replaced(client, how):
    """llama.cpp's server code runs in the replica's process: Ray's SIGTERM (how it stops a worker)
    and ray.kill must still end that process, and Serve's replacement must serve."""
    (pid,) = replica_pids("default", "PrimaryDecoder")
    if how == "SIGTERM":
        os.kill(pid, signal.SIGTERM)
    else:
        (actor,) = [a for a in ray.util.list_named_actors(all_namespaces=True) if "#PrimaryDecoder#" in a["name"]]
        ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
    assert wait_until(lambda: gone(pid), 20), f"the replica ({pid}) outlived {how}"

    def answers() -> bool:
        with contextlib.suppress(openai.OpenAIError):
            return bool(client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4).choices)
        return False

    assert wait_until(answers, 120, every_s=1.0)

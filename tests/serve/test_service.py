"""The offline default model (SmolLM2 GGUF) behind real Ray Serve, driven by the official openai
client: the contract our users rely on. The session's cluster has a (fake) GPU, so `engine: auto`
puts the GGUF on transformers, as on a GPU machine; on CPU it runs on llama.cpp (test_llamacpp.py)."""

import json

import openai
import pytest

from tests.conftest import data_url, png_bytes
from tests.serve.conftest import BASE_URL, app_status, deploy, image_chat, undeploy, wait_until, write_models

MODEL = "smollm2"


@pytest.fixture(scope="module")
def client(serve_cluster, tmp_path_factory, smollm2, tiny_vlm_dir):
    models = write_models(
        tmp_path_factory.mktemp("service"),
        [
            {
                "name": MODEL,
                "local_path": str(smollm2.parent),
                "weight_file": smollm2.name,
                "params": {"max_tokens": 48, "max_num_seqs": 4},
                "capabilities": {"vision_mode": "proxy", "captioner": "tiny-vlm"},
            },
            {"name": "tiny-vlm", "local_path": str(tiny_vlm_dir), "captioning": {"max_new_tokens": 8}},
        ],
    )
    deploy(models)
    yield openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key="unused", max_retries=0)
    undeploy("default", "vision")


def test_both_applications_running(client):
    assert app_status("default") == "RUNNING"
    assert app_status("vision") == "RUNNING"


def test_capital_of_france(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}], temperature=0
    )
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens > 10 and reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_list_content_is_accepted(client):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}],
        temperature=0,
    )
    assert "Paris" in reply.choices[0].message.content


def test_streaming_with_usage(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    assert len({c.id for c in chunks}) == 1


def test_stream_ends_with_done(http):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)


def test_stop_sequence_is_excluded(client):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        stop=["Paris"],
    )
    assert "Paris" not in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"


def test_max_completion_tokens_gives_length(client):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a long story about the sea."}],
        max_completion_tokens=3,
        max_tokens=30,
        temperature=0,
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 3


def test_models_endpoint(client):
    assert [m.id for m in client.models.list()] == [MODEL]


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    assert err.value.code == "model_not_found"


def test_invalid_base64_image_is_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**image_chat(MODEL, "data:image/png;base64,!!notbase64!!"))
    assert err.value.body["param"] == "messages[0].content[1].image_url"
    assert "base64" in err.value.body["message"]


def test_image_request_is_captioned(client):
    raw = client.chat.completions.with_raw_response.create(**image_chat(MODEL, data_url(png_bytes())), max_tokens=8)
    assert raw.http_response.status_code == 200
    assert "x-vision-degraded" not in raw.http_response.headers
    assert raw.parse().choices[0].message.content


def test_schema_errors_are_400_in_openai_shape(http):
    for body in ({"model": MODEL}, {"model": MODEL, "messages": []}, {"model": MODEL, "messages": "hi"}):
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, body
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "messages"
    response = http.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400 and "JSON" in response.json()["error"]["message"]


def test_context_overflow_is_400(http):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100_000}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_request_id_in_header_and_completion_id(http):
    response = http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    )
    rid = response.headers["x-request-id"]
    assert response.json()["id"] == f"chatcmpl-{rid}"


def test_health_reports_both_components(http):
    response = http.get("/health")
    assert response.status_code == 200
    health = response.json()
    assert health["status"] == "ok", json.dumps(health)
    assert health["components"]["decoder"]["ready"] and health["components"]["captioner"]["ready"]


def test_both_models_packed_on_one_gpu(http):
    """The session cluster has one (fake) GPU: decoder and captioner get 0.5 each, on GPU 0."""
    components = http.get("/health").json()["components"]
    assert components["decoder"]["details"]["gpu_ids"] == ["0"]
    assert components["captioner"]["details"]["gpu_ids"] == ["0"]
    assert components["decoder"]["details"]["device"] == "cpu"  # no CUDA here: the engine falls back to CPU
    assert components["decoder"]["details"]["engine"] == "transformers"  # auto, with a GPU share


def decoder_busy(http) -> int:
    details = http.get("/health").json()["components"]["decoder"]["details"]
    return details["running"] + details["waiting"]


def test_stop_string_cancels_the_sequence(client, http):
    """A 400-token story cut at its first words: the sequence leaves the batch at once, and the
    reply ends before the stop string."""
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a long story about a cat."}],
        temperature=0,
        max_tokens=400,
        stop=[" a "],
    )
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens < 20
    assert wait_until(lambda: decoder_busy(http) == 0, timeout_s=5)


def test_client_disconnect_frees_the_decoder_slot(http):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a long story about a dog."}],
        "max_tokens": 400,
        "temperature": 0,
        "stream": True,
    }
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        while '"content": ""' in (line := next(lines)) or not line.strip():
            pass  # the role chunk and blank separators
        assert decoder_busy(http) == 1
    # 400 tokens take this CPU half a minute: a free slot within seconds means the request was cancelled
    assert wait_until(lambda: decoder_busy(http) == 0, timeout_s=5, every_s=0.2)

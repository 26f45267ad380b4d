"""Several models behind one endpoint, on real Serve with the official openai client: models.yaml's
`primaries` each get their own decoder deployment with their own engine params; the ingress routes
by `model` (404 for another), /v1/models and /health list them all; two primaries that name the
same captioner share its deployment (and the ingress's caption cache), a third with another
captioner gets its own; a primary without vision refuses images while the others caption them."""

from __future__ import annotations

import httpx
import openai
import pytest
from ray import serve

from tests.conftest import data_url, png_bytes
from tests.serve.conftest import BASE_URL, app_status, deploy, image_chat, undeploy, write_models


def fake(name: str, max_tokens: int, captioner: str | None) -> dict:
    vision = {"vision_mode": "proxy", "captioner": captioner} if captioner else {"vision_mode": "disabled"}
    return {"name": name, "engine": "fake", "params": {"max_tokens": max_tokens}, "capabilities": vision}


@pytest.fixture(scope="module")
def client(serve_cluster, tmp_path_factory):
    models = write_models(
        tmp_path_factory.mktemp("several"),
        [
            fake("short", 3, "cap"),
            fake("long", 4096, "cap"),
            fake("own", 4096, "cap2"),
            fake("blind", 4096, None),
            {"name": "cap", "engine": "fake", "captioning": {"prompt_template": "first captioner"}},
            {"name": "cap2", "engine": "fake", "captioning": {"prompt_template": "second captioner"}},
        ],
        primaries=["long", "short", "own", "blind"],
    )
    deploy(models, decoder_gpus=0, captioner_gpus=0)  # the session's one fake GPU holds two halves, not six
    yield openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key="unused", max_retries=0)
    undeploy("default", "vision")


def ask(
    client: openai.OpenAI, model: str, text: str = "one two three four five six"
) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}])


def test_each_primary_has_its_own_decoder_deployment_and_the_captioners_are_shared(client):
    assert app_status("default") == "RUNNING" and app_status("vision") == "RUNNING"
    main = serve.status().applications["default"].deployments
    assert set(main) == {
        "Ingress",
        "BatchRunner",  # one for the application, whatever the models
        "PrimaryDecoder-long",
        "PrimaryDecoder-short",
        "PrimaryDecoder-own",
        "PrimaryDecoder-blind",
    }
    assert set(serve.status().applications["vision"].deployments) == {"VisionCaptioner-cap", "VisionCaptioner-cap2"}


def test_models_are_listed_in_order(client):
    assert [m.id for m in client.models.list().data] == ["long", "short", "own", "blind"]
    assert client.models.retrieve("own").id == "own"


def test_requests_go_to_their_model_with_its_own_params(client):
    short, long = ask(client, "short"), ask(client, "long")
    assert short.model == "short" and long.model == "long"
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 3
    assert long.choices[0].finish_reason == "stop" and "one two three four five six" in long.choices[0].message.content
    with pytest.raises(openai.NotFoundError) as err:
        ask(client, "gpt-9")
    assert err.value.code == "model_not_found" and "'long', 'short', 'own', 'blind'" in err.value.message


def test_images_go_to_each_model_s_captioner_and_shared_ones_share_the_cache(client):
    url = data_url(png_bytes((0, 0, 255)))
    with httpx.Client(base_url=BASE_URL, timeout=60) as http:
        answers = {}
        for model in ("long", "short", "own"):
            reply = http.post("/v1/chat/completions", json={**image_chat(model, url), "max_tokens": 4096})
            assert reply.status_code == 200, reply.text
            answers[model] = reply.json()["choices"][0]["message"]["content"]
        assert "rgb(0, 0, 255) for: first captioner" in answers["long"]
        assert "rgb(0, 0, 255) for: second captioner" in answers["own"]
        blind = http.post("/v1/chat/completions", json=image_chat("blind", url))
        assert blind.status_code == 400 and "does not accept images" in blind.json()["error"]["message"]

        health = http.get("/health").json()
        assert health["status"] == "ok" and set(health["models"]) == {"long", "short", "own", "blind"}
        caches = {m: body["components"].get("captioner", {}).get("cache") for m, body in health["models"].items()}
    # "long" then "short" asked about the same image: one caption, made once, in the shared cache.
    assert caches["long"] == caches["short"] and (caches["long"]["misses"], caches["long"]["hits"]) == (1, 1)
    assert (caches["own"]["misses"], caches["own"]["hits"]) == (1, 0)
    assert caches["blind"] is None

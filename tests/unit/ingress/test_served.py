"""Several models behind one endpoint (`served.ServedModels` in `build_api`), with fake decoder
handles and no Ray: each request goes to the decoder of the model it names, an unknown model is a
404 that lists the served ones, /v1/models lists them all, /health covers all of them, and the
ingress metrics carry the model a request named when it is a served one."""

from __future__ import annotations

import httpx

from deployments.config import ServerConfig
from deployments.ingress.api import build_api
from deployments.ingress.guard import GuardSettings
from deployments.ingress.health import HealthService
from deployments.ingress.served_models import ServedModel, ServedModels
from deployments.protocol.openai.models import ModelCard
from tests.unit.fake_metrics import FakeMetrics
from tests.unit.ingress.fakes import FakeCaptioner, FakeDecoder, answer_core


def served(name: str, decoder: FakeDecoder, captioner: FakeCaptioner | None = None) -> ServedModel:
    core = answer_core(decoder, captioner, model_name=name)
    return ServedModel(ModelCard(id=name, created=1), core, HealthService(decoder, captioner, model_name=name))


def client(models: ServedModels, metrics: FakeMetrics) -> httpx.AsyncClient:
    guard = GuardSettings.from_config(ServerConfig(api_keys_env=None))
    api = build_api(models, guard, metrics)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://test")


def chat(model: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}]}


async def test_requests_go_to_the_decoder_of_the_model_they_name():
    small, large = FakeDecoder(["small"]), FakeDecoder(["large"])
    metrics = FakeMetrics()
    async with client(ServedModels([served("small", small), served("large", large)]), metrics) as http:
        a = await http.post("/v1/chat/completions", json=chat("large"))
        b = await http.post("/v1/completions", json={"model": "small", "prompt": "hi"})
        assert a.json()["choices"][0]["message"]["content"] == "large" and a.json()["model"] == "large"
        assert b.json()["choices"][0]["text"] == "small" and b.json()["model"] == "small"
        assert len(small.requests) == len(large.requests) == 1

        unknown = await http.post("/v1/chat/completions", json=chat("gpt-9"))
        assert unknown.status_code == 404
        error = unknown.json()["error"]
        assert error["code"] == "model_not_found" and error["param"] == "model"
        assert "'small', 'large'" in error["message"]
        assert len(small.requests) == len(large.requests) == 1

        listed = (await http.get("/v1/models")).json()["data"]
        assert [card["id"] for card in listed] == ["small", "large"]
        assert (await http.get("/v1/models/large")).json()["id"] == "large"
    # The `model` label: a served model's name; an unknown one keeps the default (no new label values).
    assert metrics.count("http_requests", model="large", status="200") == 1
    assert metrics.count("http_requests", model="small", status="200") == 1
    assert metrics.count("http_requests", model="gpt-9") == 0
    assert metrics.count("requests_rejected", reason="model_not_found") == 1


async def test_health_covers_every_model_and_is_503_only_when_no_decoder_serves():
    first, second = FakeDecoder(), FakeDecoder()
    models = ServedModels([served("a", first, FakeCaptioner()), served("b", second)])
    body, code = await models.health()
    assert (code, body["status"]) == (200, "ok")
    assert set(body["models"]) == {"a", "b"} and body["components"] == body["models"]["a"]["components"]
    assert "captioner" in body["models"]["a"]["components"] and "captioner" not in body["models"]["b"]["components"]

    second.down = True
    body, code = await models.health()
    assert (code, body["status"]) == (200, "degraded")
    assert body["models"]["b"]["status"] == "unavailable" and body["models"]["a"]["status"] == "ok"

    first.down = True
    body, code = await models.health()
    assert (code, body["status"]) == (503, "unavailable")


async def test_one_model_keeps_the_single_model_health_body():
    body, code = await ServedModels([served("a", FakeDecoder())]).health()
    assert code == 200 and set(body) == {"status", "components"}

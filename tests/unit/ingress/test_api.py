"""The ingress's FastAPI app as `build_api` makes it for one replica, over httpx's ASGI transport
with fake handles and no Ray: thin routes, the guard with this replica's settings, OpenAI-shaped
errors and an OpenAPI spec without FastAPI's 422."""

from __future__ import annotations

import json
from collections.abc import Sequence

import httpx
from ray.serve.exceptions import BackPressureError

from deployments.config import ServerConfig
from deployments.ingress.api import build_api
from deployments.ingress.guard import GuardSettings
from deployments.ingress.health import HealthService
from deployments.ingress.served_models import ServedModel, ServedModels
from deployments.protocol.openai.models import ModelCard
from tests.unit.fake_metrics import FakeMetrics
from tests.unit.ingress.fakes import FakeCaptioner, FakeDecoder, answer_core

KEY = "sk-api-test-0123"


def client(
    decoder: FakeDecoder,
    keys: Sequence[str] = (),
    captioner: FakeCaptioner | None = None,
    metrics: FakeMetrics | None = None,
) -> httpx.AsyncClient:
    core = answer_core(decoder, captioner)
    health = HealthService(decoder, captioner, model_name="echo")
    guard = GuardSettings.from_config(ServerConfig(api_keys=list(keys), api_keys_env=None))
    served = ServedModels([ServedModel(ModelCard(id="echo", created=1), core, health)])
    api = build_api(served, guard, metrics or FakeMetrics())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://test")


BODY = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


async def test_routes_answer_in_openai_shapes():
    async with client(FakeDecoder(["Hi", "!"])) as http:
        reply = await http.post("/v1/chat/completions", json=BODY, headers={"x-request-id": "abc"})
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "Hi!"
        assert reply.json()["id"] == "chatcmpl-abc"
        streamed = await http.post("/v1/chat/completions", json={**BODY, "stream": True})
        assert streamed.headers["content-type"].startswith("text/event-stream")
        assert streamed.text.endswith("data: [DONE]\n\n")
        assert (await http.get("/v1/models")).json()["data"][0]["id"] == "echo"
        health = await http.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"


async def test_health_reports_the_captioner_and_its_cache_and_degrades_without_it():
    up = HealthService(FakeDecoder(), FakeCaptioner(), model_name="echo")
    body, code = await up.report()
    assert (code, body["status"]) == (200, "ok")
    assert body["components"]["captioner"]["ready"] and "hits" in body["components"]["captioner"]["cache"]
    body, code = await HealthService(FakeDecoder(), FakeCaptioner(down=True), model_name="echo").report()
    assert (code, body["status"]) == (200, "degraded") and body["components"]["captioner"]["reason"] == "replica died"


async def test_errors_are_openai_shaped_with_their_status():
    async with client(FakeDecoder(error=BackPressureError(5, 4, retry_after_s=1))) as http:
        full = await http.post("/v1/chat/completions", json=BODY)
        assert full.status_code == 503 and full.headers["retry-after"] == "1"
        assert full.json()["error"]["code"] == "overloaded"
        schema = await http.post("/v1/chat/completions", json={"model": "echo"})
        assert schema.status_code == 400 and schema.json()["error"]["param"] == "messages"
        unknown = await http.post("/v1/chat/completions", json={**BODY, "model": "gpt-9"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        missing = await http.get("/v2/nothing")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


async def test_the_guard_uses_this_apps_settings():
    async with client(FakeDecoder(), keys=[KEY]) as http:
        assert (await http.post("/v1/chat/completions", json=BODY)).status_code == 401
        authorized = await http.post("/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {KEY}"})
        assert authorized.status_code == 200
        assert (await http.get("/health")).status_code == 200


async def test_the_spec_has_no_422_and_keeps_its_operations():
    async with client(FakeDecoder()) as http:
        spec = (await http.get("/openapi.json")).json()
    assert "422" not in json.dumps(spec) and "HTTPValidationError" not in json.dumps(spec)
    operations = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    assert operations == {
        "models_v1_models_get",
        "model_card_v1_models__model__get",
        "health_health_get",
        "chat_completions_v1_chat_completions_post",
        "legacy_completions_v1_completions_post",
        "embeddings_v1_embeddings_post",
        "messages_v1_messages_post",
        "count_tokens_v1_messages_count_tokens_post",
        "tokenize_tokenize_post",
        "detokenize_detokenize_post",
        "create_response_v1_responses_post",
        "compact_response_v1_responses_compact_post",
        "get_response_v1_responses__response_id__get",
        "delete_response_v1_responses__response_id__delete",
        "response_input_items_v1_responses__response_id__input_items_get",
    }

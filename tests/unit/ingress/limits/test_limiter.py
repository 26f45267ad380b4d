"""The limiter in the ingress's app as `build_api` makes it, over httpx's ASGI transport with a fake
decoder and an in-process ledger in place of the board actor: 429s in each API's shape with their
headers, the model list, settlement to the tokens used, the decoders' tenant, and the metrics."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence

import httpx
import pytest

from deployments.config import ServerConfig
from deployments.config.limits import parse_limits
from deployments.errors import InvalidRequestError
from deployments.ingress.api import build_api
from deployments.ingress.apis.counting import ROUTES
from deployments.ingress.guard import GuardSettings
from deployments.ingress.health import HealthService
from deployments.ingress.limits import estimate
from deployments.ingress.limits.ledger import Caps, Ledger, Verdict
from deployments.ingress.limits.limiter import Limiter
from deployments.ingress.limits.table import KeyTable
from deployments.ingress.served_models import ServedModel, ServedModels
from deployments.protocol.openai.models import ModelCard
from tests.unit.fake_metrics import FakeMetrics
from tests.unit.ingress.fakes import FakeDecoder, answer_core

KEY_A, KEY_B, OPEN_KEY = "sk-team-a-0123456789", "sk-team-b-9876543210", "sk-open-key-000000"
LIMITS = f"""
default: {{requests_per_minute: 100}}
keys:
  - name: team-a
    key_env: TEAM_A_KEY
    requests_per_minute: 2
    tokens_per_minute: 5000
    models: [echo]
    priority: 3
    max_slot_share: 0.5
  - name: team-b
    key_sha256: {hashlib.sha256(KEY_B.encode()).hexdigest()}
    tokens_per_minute: 1000
"""
BODY = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}


class LocalBoard:
    """The board's calls on a ledger in this process."""

    def __init__(self) -> None:
        self.ledger = Ledger()
        self.settled: list[tuple[int, int]] = []

    async def admit(self, name: str, caps: Caps, tokens: int) -> Verdict | None:
        return self.ledger.admit(name, caps, tokens)

    def settle(self, ticket: int, used_tokens: int) -> None:
        self.settled.append((ticket, used_tokens))
        self.ledger.settle(ticket, used_tokens)


def served_models(decoder: FakeDecoder) -> ServedModels:
    return ServedModels(
        [
            ServedModel(
                ModelCard(id=name, created=1), answer_core(decoder), HealthService(decoder, None, model_name=name)
            )
            for name in ("echo", "other")
        ]
    )


def client(
    decoder: FakeDecoder, board: LocalBoard, metrics: FakeMetrics, keys: Sequence[str] = (OPEN_KEY,)
) -> httpx.AsyncClient:
    served = served_models(decoder)
    table = KeyTable(parse_limits(LIMITS, "limits.yaml"), None, environ={"TEAM_A_KEY": KEY_A})
    guard = GuardSettings.from_config(ServerConfig(api_keys=list(keys), api_keys_env=None), extra_keys=table)
    limiter = Limiter(table, board, served, {"echo": 64, "other": 64}, metrics, routes=ROUTES)
    api = build_api(served, guard, metrics, limiter=limiter)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://test")


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_a_key_over_its_requests_gets_a_429_with_headers_while_another_key_is_served() -> None:
    board, metrics = LocalBoard(), FakeMetrics()
    async with client(FakeDecoder(["Hi"]), board, metrics) as http:
        first = await http.post("/v1/chat/completions", json=BODY, headers=auth(KEY_A))
        assert first.status_code == 200
        assert first.headers["x-ratelimit-limit-requests"] == "2"
        assert first.headers["x-ratelimit-remaining-requests"] == "1"
        assert first.headers["x-ratelimit-limit-tokens"] == "5000"
        assert (await http.post("/v1/chat/completions", json=BODY, headers=auth(KEY_A))).status_code == 200
        refused = await http.post("/v1/chat/completions", json=BODY, headers=auth(KEY_A))
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert (error["code"], error["type"]) == ("rate_limit_exceeded", "requests")
        assert refused.headers["retry-after"] == "30" and refused.headers["x-ratelimit-remaining-requests"] == "0"
        served = await http.post("/v1/chat/completions", json=BODY, headers=auth(OPEN_KEY))
        assert served.status_code == 200 and served.headers["x-ratelimit-limit-requests"] == "100"
    assert metrics.count("key_rate_limited", key="team-a", limit="requests") == 1
    assert metrics.count("key_requests", key="team-a") == 2 and metrics.count("key_requests", key="default") == 1


async def test_anthropic_routes_answer_in_anthropics_shape_and_headers() -> None:
    board = LocalBoard()
    body = {"model": "echo", "max_tokens": 2000, "messages": [{"role": "user", "content": "hi"}]}
    async with client(FakeDecoder(["Hi"]), board, FakeMetrics()) as http:
        refused = await http.post("/v1/messages", json=body, headers={"x-api-key": KEY_B})
        assert refused.status_code == 429
        assert refused.json() == {
            "type": "error",
            "error": {"type": "rate_limit_error", "message": refused.json()["error"]["message"]},
        }
        assert "limit 1000" in refused.json()["error"]["message"]
        assert refused.headers["x-should-retry"] == "false"  # 2000 tokens never fit in 1000 a minute
        body["max_tokens"] = 100
        ok = await http.post("/v1/messages", json=body, headers={"x-api-key": KEY_B})
        assert ok.status_code == 200 and ok.headers["anthropic-ratelimit-tokens-limit"] == "1000"
        assert "x-ratelimit-limit-tokens" not in ok.headers


async def test_tokens_are_settled_to_what_the_request_used() -> None:
    board = LocalBoard()
    async with client(FakeDecoder(["a", "b", "c"]), board, FakeMetrics()) as http:
        reply = await http.post("/v1/chat/completions", json=BODY, headers=auth(KEY_B))
        usage = reply.json()["usage"]
        streamed = await http.post("/v1/chat/completions", json={**BODY, "stream": True}, headers=auth(KEY_B))
        assert streamed.status_code == 200
    assert board.settled[0][1] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert len(board.settled) == 2 and board.settled[1][1] > 0
    assert board.ledger.in_flight("team-b") == 0


async def test_a_model_the_key_may_not_use_is_unknown_to_it_everywhere() -> None:
    async with client(FakeDecoder(["Hi"]), LocalBoard(), FakeMetrics()) as http:
        hidden = await http.post("/v1/chat/completions", json={**BODY, "model": "other"}, headers=auth(KEY_A))
        unknown = await http.post("/v1/chat/completions", json={**BODY, "model": "nope"}, headers=auth(KEY_A))
        assert hidden.status_code == unknown.status_code == 404
        assert hidden.json()["error"]["code"] == "model_not_found"
        assert hidden.json()["error"] == {
            **unknown.json()["error"],
            "message": unknown.json()["error"]["message"].replace("nope", "other"),
        }
        assert hidden.json()["error"]["message"] == "The model 'other' does not exist. Available: 'echo'."
        listed = await http.get("/v1/models", headers=auth(KEY_A))
        assert [m["id"] for m in listed.json()["data"]] == ["echo"]
        assert (await http.get("/v1/models/other", headers=auth(KEY_A))).status_code == 404
        assert (await http.get("/v1/models/other", headers=auth(KEY_B))).status_code == 200
        tokenized = await http.post("/tokenize", json={"model": "other", "prompt": "x"}, headers=auth(KEY_A))
        assert tokenized.status_code == 404


async def test_the_decoder_gets_the_keys_tenant_and_priority() -> None:
    decoder = FakeDecoder(["Hi"])
    async with client(decoder, LocalBoard(), FakeMetrics()) as http:
        await http.post("/v1/chat/completions", json={**BODY, "priority": -5}, headers=auth(KEY_A))
        await http.post("/v1/chat/completions", json={**BODY, "priority": 7}, headers=auth(KEY_A))
        await http.post("/v1/chat/completions", json=BODY, headers=auth(OPEN_KEY))
    a, a_later, other = decoder.requests
    assert (a.tenant, a.priority, a.tenant_share) == ("team-a", 3, 0.5)  # never earlier than the key's
    assert a_later.priority == 7
    assert other.tenant.startswith("default:") and other.priority == 0 and other.tenant_share is None


async def test_named_keys_are_accepted_without_the_key_list_and_others_are_not() -> None:
    async with client(FakeDecoder(["Hi"]), LocalBoard(), FakeMetrics(), keys=()) as http:
        assert (await http.post("/v1/chat/completions", json=BODY, headers=auth(KEY_B))).status_code == 200
        assert (await http.post("/v1/chat/completions", json=BODY, headers=auth("sk-nobody-0000"))).status_code == 401


async def test_a_batch_line_waits_for_its_keys_budget_instead_of_a_429() -> None:
    board = LocalBoard()
    body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6000}
    need = estimate.prompt_tokens(body) + estimate.completion_tokens(body, 64)
    digest = hashlib.sha256(KEY_A.encode()).hexdigest()
    text = f"keys: [{{name: batcher, key_sha256: {digest}, tokens_per_minute: {2 * need - 20}}}]"
    table = KeyTable(parse_limits(text, "limits.yaml"), None, environ={})
    limiter = Limiter(table, board, served_models(FakeDecoder()), {"echo": 64}, FakeMetrics(), routes=ROUTES)
    key = table.named("batcher", "batcher")
    first = await limiter.admit_waiting(key, "/v1/chat/completions", body)
    started = time.monotonic()
    second = await limiter.admit_waiting(key, "/v1/chat/completions", body)  # 20 tokens short: ~0.1 s
    assert first.ticket is not None and second.ticket is not None and time.monotonic() - started >= 0.05
    with pytest.raises(InvalidRequestError, match="Request too large"):
        await limiter.admit_waiting(key, "/v1/chat/completions", {**body, "max_tokens": 3 * need})
    gone = table.named("removed-from-the-file", "default:abc")
    assert (gone.name, gone.queue) == ("default", "default:abc")


def test_websocket_turns_are_admitted_as_requests_and_keep_to_the_keys_models() -> None:
    from starlette.testclient import TestClient

    decoder, board = FakeDecoder(["Hi"]), LocalBoard()
    served = served_models(decoder)
    table = KeyTable(parse_limits(LIMITS, "limits.yaml"), None, environ={"TEAM_A_KEY": KEY_A})
    guard = GuardSettings.from_config(ServerConfig(api_keys_env=None), extra_keys=table)
    limiter = Limiter(table, board, served, {"echo": 64}, FakeMetrics(), routes=ROUTES)
    app = build_api(served, guard, FakeMetrics(), limiter=limiter)
    events = []
    with TestClient(app) as client, client.websocket_connect("/v1/responses", headers=auth(KEY_A)) as socket:
        for model in ("echo", "echo", "echo", "other"):  # team-a: 2 requests a minute, echo only
            socket.send_text(json.dumps({"type": "response.create", "model": model, "input": "hi", "store": False}))
            while True:
                event = json.loads(socket.receive_text())
                if event["type"] in ("response.completed", "error"):
                    events.append(event)
                    break
    assert [e["type"] for e in events] == ["response.completed", "response.completed", "error", "error"]
    assert events[2]["status"] == 429 and events[2]["error"]["code"] == "rate_limit_exceeded"
    assert events[3]["status"] == 404 and events[3]["error"]["code"] == "model_not_found"
    assert decoder.requests[0].tenant == "team-a" and len(board.settled) == 2

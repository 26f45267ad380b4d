"""What the limits count, as each API declares it (`apis/counting.py`, handed to the limits by the
builder): every route of the app that may reach a model or write state has a declaration (a new
route cannot walk around the limits by being forgotten), the limits count by the table they are
given and read a request's budget as its declaration says, /v1/responses/compact is admitted and
settled as the generation it is, and the Conversations API's writes are counted as requests with no
tokens."""

from __future__ import annotations

import hashlib

import httpx
import pytest
from fastapi.routing import APIRoute

from deployments.config import BatchesConfig, ServerConfig
from deployments.config.limits import parse_limits
from deployments.ingress.api import build_api
from deployments.ingress.apis.counting import ROUTES
from deployments.ingress.guard import GuardSettings
from deployments.ingress.limits import estimate
from deployments.ingress.limits.counting import Budget, Counted, CountingTable, RouteCounting
from deployments.ingress.limits.limiter import Limiter
from deployments.ingress.limits.table import KeyTable
from deployments.protocol.openai.completions import CompletionRequest
from deployments.state.batches import BatchStore
from deployments.state.conversations import ConversationStore
from deployments.state.records import stored_owners
from tests.support.stores import stored_responses, temporary_storage
from tests.unit.fake_metrics import FakeMetrics
from tests.unit.ingress.fakes import FakeDecoder
from tests.unit.ingress.limits.test_estimate import CountingBoard
from tests.unit.ingress.limits.test_limiter import LocalBoard, served_models

KEY = "sk-counted-0123456789"
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def limits(**caps: int) -> KeyTable:
    fields = ", ".join(f"{name}: {value}" for name, value in caps.items())
    text = f"keys: [{{name: counted, key_sha256: {hashlib.sha256(KEY.encode()).hexdigest()}, {fields}}}]"
    return KeyTable(parse_limits(text, "limits.yaml"), None, environ={})


def whole_app(board: LocalBoard, table: KeyTable, metrics: FakeMetrics | None = None, routes: CountingTable = ROUTES):
    """The ingress's app with every API served (responses, files and batches, conversations), its
    routes counted as `routes` declares."""
    served = served_models(FakeDecoder(["Sum", "mary."]))
    storage = temporary_storage()
    owners = stored_owners(storage)
    guard = GuardSettings.from_config(ServerConfig(api_keys_env=None), extra_keys=table)
    limiter = Limiter(table, board, served, {"echo": 64, "other": 64}, metrics or FakeMetrics(), routes=routes)
    return build_api(
        served,
        guard,
        FakeMetrics(),
        stored_responses(),
        BatchStore.open(BatchesConfig(), storage, owners),
        limiter=limiter,
        conversations=ConversationStore(storage, owners, 1_000_000),
    )


def client(
    board: LocalBoard, table: KeyTable, metrics: FakeMetrics | None = None, routes: CountingTable = ROUTES
) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=whole_app(board, table, metrics, routes))
    return httpx.AsyncClient(transport=transport, base_url="http://test", headers={"Authorization": f"Bearer {KEY}"})


def test_every_route_that_may_reach_a_model_or_write_has_a_declaration_and_every_declaration_a_route():
    api = whole_app(LocalBoard(), limits(requests_per_minute=1))
    routes = {(method, route.path) for route in api.routes if isinstance(route, APIRoute) for method in route.methods}
    undeclared = sorted(f"{m} {p}" for m, p in routes if m in WRITE_METHODS and not ROUTES.declared(m, p))
    assert not undeclared, f"declare how the limits count these in their API's counting.py: {undeclared}"
    stale = sorted(f"{r.method} {r.path}" for r in ROUTES.declarations if (r.method, r.path) not in routes)
    assert not stale, f"declarations without a route: {stale}"
    generating = {p for m, p in routes if ROUTES.of(m, p) is Counted.GENERATES}
    assert {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"} <= generating
    assert "/v1/responses/compact" in generating


def test_a_templated_declaration_matches_its_paths_only():
    table = CountingTable([RouteCounting("DELETE", "/v1/things/{thing_id}", Counted.WRITES)])
    assert table.of("DELETE", "/v1/things/abc") is Counted.WRITES
    assert table.of("DELETE", "/v1/things/abc/more") is None and table.of("POST", "/v1/things/abc") is None
    with pytest.raises(ValueError, match="declared twice"):
        CountingTable([RouteCounting("POST", "/v1/x", Counted.WRITES)] * 2)


async def test_the_limits_count_by_the_table_they_are_given_and_read_the_budget_it_declares():
    """The limits import no API: here chat's budget is declared as a legacy completion reads it (its
    `max_tokens`, 16 when unset, for each of its `n`) and /v1/completions is not declared at all."""
    routes = CountingTable(
        [
            RouteCounting(
                "POST", "/v1/chat/completions", Counted.GENERATES, Budget.read(CompletionRequest, "max_tokens", n=True)
            )
        ]
    )
    board = CountingBoard()
    chat = {"model": "echo", "n": "2", "messages": [{"role": "user", "content": "hi"}]}
    legacy = {"model": "echo", "prompt": "hi", "max_tokens": 5}
    async with client(board, limits(requests_per_minute=1, tokens_per_minute=10_000), routes=routes) as http:
        counted = await http.post("/v1/chat/completions", json=chat)
        uncounted = [await http.post("/v1/completions", json=legacy) for _ in range(2)]
    assert counted.status_code == 200 and counted.headers["x-ratelimit-limit-requests"] == "1"
    assert board.reserved == [estimate.prompt_tokens(chat) + 16 * 2]  # not the model's 64: the declared default
    assert [a.status_code for a in uncounted] == [200, 200] and "x-ratelimit-limit-requests" not in uncounted[0].headers


async def test_compact_is_admitted_against_the_keys_requests_and_settled_to_what_it_generated():
    board, metrics = LocalBoard(), FakeMetrics()
    body = {"model": "echo", "input": [{"role": "user", "content": "Summarize our talk."}]}
    async with client(board, limits(requests_per_minute=2, tokens_per_minute=100_000), metrics) as http:
        answers = [await http.post("/v1/responses/compact", json=body) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[0].headers["x-ratelimit-limit-requests"] == "2"
    assert answers[2].json()["error"]["code"] == "rate_limit_exceeded"
    assert len(board.settled) == 2 and all(used > 0 for _, used in board.settled)
    assert metrics.count("key_requests", key="counted") == 2 and board.ledger.in_flight("counted") == 0


async def test_conversation_writes_are_counted_as_requests_with_no_tokens_and_reads_are_not():
    board = LocalBoard()
    async with client(board, limits(requests_per_minute=3, tokens_per_minute=10)) as http:
        created = await http.post("/v1/conversations", json={"items": [{"role": "user", "content": "hi"}]})
        assert created.status_code == 200 and created.headers["x-ratelimit-remaining-requests"] == "2"
        assert created.headers["x-ratelimit-remaining-tokens"] == "10"  # nothing reserved
        conversation = created.json()["id"]
        for _ in range(3):  # reads are free
            assert (await http.get(f"/v1/conversations/{conversation}/items")).status_code == 200
        added = await http.post(
            f"/v1/conversations/{conversation}/items", json={"items": [{"role": "user", "content": "more"}]}
        )
        assert added.status_code == 200
        deleted = await http.delete(f"/v1/conversations/{conversation}")
        assert deleted.status_code == 200
        refused = await http.post("/v1/conversations", json={})
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "requests"
    assert "retry-after" in refused.headers
    assert [used for _, used in board.settled] == [0, 0, 0] and board.ledger.in_flight("counted") == 0


async def test_a_conversation_write_holds_a_place_among_the_keys_concurrent_requests():
    board, table = LocalBoard(), limits(max_concurrent=1)
    busy = board.ledger.admit("counted", table.named("counted", "counted").caps, 0)  # the key's one place, taken
    assert busy.ticket is not None
    async with client(board, table) as http:
        refused = await http.post("/v1/conversations", json={})
        assert refused.status_code == 429 and "concurrent" in refused.json()["error"]["message"]
        board.ledger.settle(busy.ticket, 0)
        assert (await http.post("/v1/conversations", json={})).status_code == 200

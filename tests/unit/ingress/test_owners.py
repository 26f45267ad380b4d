"""Stored responses belong to the API key that made them (`ingress.owners`): with two keys, no Ray,
another key's GET, input items, DELETE, continuation (HTTP and WebSocket) and compaction answer as an
unknown id would, byte for byte but the id; the owner's response stays; the store keeps a keyed
hash, never the key; with no keys nothing changes; a refusal is logged with the request's id only."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from deployments.config import ServerConfig
from deployments.ingress.api import build_api
from deployments.ingress.guard import GuardSettings
from deployments.ingress.health import HealthService
from deployments.ingress.served_models import ServedModel, ServedModels
from deployments.protocol.openai.models import ModelCard
from deployments.state.owners import Caller, Owners
from deployments.state.responses import StoredResponses
from tests.support.stores import stored_responses
from tests.unit.fake_metrics import FakeMetrics
from tests.unit.ingress.fakes import FakeDecoder, answer_core

KEY_A, KEY_B = "key-tenant-a-0001", "key-tenant-b-0002"
UNKNOWN = "resp_" + "0" * 24


def app(store: StoredResponses, keys: list[str]) -> Any:
    decoder = FakeDecoder(["Noted."])
    core = answer_core(decoder)
    served = ServedModels(
        [ServedModel(ModelCard(id="echo", created=1), core, HealthService(decoder, None, model_name="echo"))]
    )
    guard = GuardSettings.from_config(ServerConfig(api_keys_env=None, api_keys=keys))
    return build_api(served, guard, FakeMetrics(), store)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def tenants() -> Iterator[tuple[TestClient, StoredResponses]]:
    store = stored_responses()
    with TestClient(app(store, [KEY_A, KEY_B])) as client:
        yield client, store


def answer(response: httpx.Response, rid: str) -> tuple[int, str, dict[str, str]]:
    """What a client learns from an answer, the id it asked for put aside."""
    headers = {k: v for k, v in response.headers.items() if k not in ("date", "x-request-id", "content-length")}
    return response.status_code, response.text.replace(rid, "<id>"), headers


def ask(client: TestClient, method: str, path: str, body: dict[str, Any] | None, rid: str) -> httpx.Response:
    """The request, by key B, for the response `rid` (in place of "{id}")."""
    payload = json.loads(json.dumps(body).replace("{id}", rid)) if body else None
    return client.request(method, path.replace("{id}", rid), json=payload, headers=auth(KEY_B))


def kept_owner(store: StoredResponses, response_id: str) -> str | None:
    """The owner's tag that the store keeps beside a response, as it lies in the storage root."""
    return json.loads(store.storage.read(f"responses/{response_id}.json") or b"{}")["owner"]


def test_another_keys_response_is_an_unknown_id_and_stays_its_owners(tenants, caplog):
    client, store = tenants
    created = client.post("/v1/responses", json={"model": "echo", "input": "My secret is 4471."}, headers=auth(KEY_A))
    secret = created.json()["id"]
    reads: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", "/v1/responses/{id}", None),
        ("GET", "/v1/responses/{id}/input_items", None),
        ("DELETE", "/v1/responses/{id}", None),
        ("POST", "/v1/responses", {"model": "echo", "input": "And?", "previous_response_id": "{id}"}),
        ("POST", "/v1/responses/compact", {"model": "echo", "previous_response_id": "{id}"}),
    ]
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        for method, path, body in reads:
            theirs, nobodys = (ask(client, method, path, body, rid) for rid in (secret, UNKNOWN))
            assert theirs.status_code == (400 if method == "POST" else 404), (method, path, theirs.text)
            assert answer(theirs, secret) == answer(nobodys, UNKNOWN), (method, path)
    owners_view = client.get(f"/v1/responses/{secret}", headers=auth(KEY_A))
    assert owners_view.status_code == 200 and owners_view.json() == created.json()
    items = client.get(f"/v1/responses/{secret}/input_items", headers=auth(KEY_A)).json()
    assert items["data"][0]["content"][0]["text"] == "My secret is 4471."
    going_on = {"model": "echo", "input": "Again?", "previous_response_id": secret}
    assert client.post("/v1/responses", json=going_on, headers=auth(KEY_A)).status_code == 200
    refusals = [r.getMessage() for r in caplog.records if "another API key" in r.getMessage()]
    assert len(refusals) == len(reads)
    kept_tag = kept_owner(store, secret)
    for line in refusals:
        assert secret in line and "request " in line
        assert KEY_A not in line and KEY_B not in line and (kept_tag or "-") not in line
    assert client.delete(f"/v1/responses/{secret}", headers=auth(KEY_A)).status_code == 200


def test_the_store_keeps_a_keyed_hash_of_the_owner_never_the_key(tenants):
    client, store = tenants
    created = client.post("/v1/responses", json={"model": "echo", "input": "hi"}, headers=auth(KEY_A)).json()
    tag = kept_owner(store, created["id"])
    record = store.storage.read(f"responses/{created['id']}.json") or b""
    assert KEY_A.encode() not in record and hashlib.sha256(KEY_A.encode()).hexdigest().encode() not in record
    digest = hashlib.sha256(KEY_A.encode()).digest()
    assert tag is not None and KEY_A not in tag and digest.hex() not in tag
    assert tag != hashlib.sha256(digest).hexdigest()  # keyed: not a plain hash of what the guard holds
    assert tag != Owners().tag(Caller(digest))  # each store's own secret


def test_a_continuation_over_the_websocket_by_another_key_is_not_found(tenants):
    client, _ = tenants
    secret = client.post("/v1/responses", json={"model": "echo", "input": "cobalt"}, headers=auth(KEY_A)).json()["id"]

    def turn(key: str, previous: str) -> dict:
        with client.websocket_connect("/v1/responses", headers=auth(key)) as socket:
            event = {"type": "response.create", "model": "echo", "input": "which?", "previous_response_id": previous}
            socket.send_text(json.dumps(event))
            return json.loads(socket.receive_text())

    theirs, nobodys = turn(KEY_B, secret), turn(KEY_B, UNKNOWN)
    assert theirs["type"] == "error" and theirs["error"]["code"] == "previous_response_not_found"
    assert json.dumps(theirs).replace(secret, "<id>") == json.dumps(nobodys).replace(UNKNOWN, "<id>")
    assert turn(KEY_A, secret)["type"] == "response.created"


def test_without_keys_every_caller_reaches_every_response():
    with TestClient(app(stored_responses(), [])) as client:
        rid = client.post("/v1/responses", json={"model": "echo", "input": "hi"}).json()["id"]
        assert client.get(f"/v1/responses/{rid}").status_code == 200


async def test_keys_rotated_leave_responses_unreachable_never_reassigned():
    store = stored_responses()
    a, b = (Caller(hashlib.sha256(k.encode()).digest()) for k in (KEY_A, KEY_B))
    await store.put("resp_by_a", {"response": {}}, a)
    await store.put("resp_by_nobody", {"response": {}}, Caller())
    assert (await store.get("resp_by_a", a)).thing is not None
    for other, rid in ((b, "resp_by_a"), (Caller(), "resp_by_a"), (a, "resp_by_nobody")):
        found = await store.get(rid, other)
        assert found.thing is None and found.foreign
    assert (await store.delete("resp_by_a", b)).thing is None and (await store.get("resp_by_a", a)).thing is not None

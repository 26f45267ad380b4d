"""The Conversations API through the ingress's app (guard and error mapping included, no Ray): the
official openai client's calls, from create to delete; OpenAI's bounds as 400s (20 items at a time,
16 metadata pairs, an item of no known shape); another key's conversation, the 404 of an unknown
one; and the routes absent without a store. Each key's quotas (issue 67): OpenAI's 400 past them, a
Responses turn refused before it generates, and the store's storage work never on the event loop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

from deployments.config import ServerConfig
from deployments.ingress.api import build_api
from deployments.ingress.guard import GuardSettings
from deployments.ingress.health import HealthService
from deployments.ingress.served_models import ServedModel, ServedModels
from deployments.protocol.openai.models import ModelCard
from deployments.state.conversations import ConversationStore
from deployments.state.records import stored_owners
from deployments.state.responses import StoredResponses
from deployments.state.storage import LocalStorage
from tests.unit.fake_metrics import FakeMetrics
from tests.unit.ingress.fakes import FakeDecoder, answer_core

KEY_A, KEY_B = "sk-alice-0123456", "sk-bob-012345678"
UNKNOWN = "conv_" + "0" * 32


def served() -> ServedModels:
    health = HealthService(FakeDecoder(), None, model_name="echo")
    return ServedModels([ServedModel(ModelCard(id="echo", created=1), answer_core(FakeDecoder()), health)])


def app(root: Path | None, max_bytes: int = 1_000_000, **quotas: Any) -> TestClient:
    """The ingress's app with two keys, over a conversations' store at `root` (None: no store)."""
    conversations = None
    if root is not None:
        storage = LocalStorage(str(root))
        conversations = ConversationStore(storage, stored_owners(storage), max_bytes, **quotas)
    guard = GuardSettings.from_config(ServerConfig(api_keys=[KEY_A, KEY_B], api_keys_env=None))
    return TestClient(build_api(served(), guard, FakeMetrics(), conversations=conversations), base_url="http://test")


def client(http: TestClient, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://test/v1", api_key=key, http_client=http, max_retries=0)


def auth(key: str = KEY_A) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture
def http(tmp_path: Path) -> Iterator[TestClient]:
    with app(tmp_path) as test_client:
        yield test_client


def test_the_openai_client_from_create_to_delete(http):
    api = client(http)
    created = api.conversations.create(
        items=[{"role": "system", "content": "Be terse."}, {"type": "message", "role": "user", "content": "Hi"}],
        metadata={"topic": "greeting"},
    )
    assert created.id.startswith("conv_") and created.object == "conversation"
    assert created.metadata == {"topic": "greeting"}
    assert api.conversations.retrieve(created.id) == created
    assert api.conversations.update(created.id, metadata={"topic": "other"}).metadata == {"topic": "other"}

    answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]}
    call = {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"q": "x"}'}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "found"}
    added = api.conversations.items.create(
        created.id, items=[answer, call, output], include=["message.output_text.logprobs"]
    )
    assert [item.type for item in added.data] == ["message", "function_call", "function_call_output"]
    assert added.first_id == added.data[0].id and added.last_id == added.data[2].id and not added.has_more
    assert [item.id.split("_")[0] for item in added.data] == ["msg", "fc", "fco"]

    newest = api.conversations.items.list(created.id, limit=2)
    assert [item.type for item in newest.data] == ["function_call_output", "function_call"] and newest.has_more
    everything = [item.id for item in api.conversations.items.list(created.id, limit=2, order="asc")]  # every page
    assert len(everything) == 5 and everything[2:] == [item.id for item in added.data]

    first = api.conversations.items.retrieve(everything[0], conversation_id=created.id)
    assert first.type == "message" and first.role == "system" and first.status == "completed"
    kept = api.conversations.items.delete(everything[0], conversation_id=created.id)
    assert kept.id == created.id and kept.object == "conversation"  # the conversation, as OpenAI answers
    assert [item.id for item in api.conversations.items.list(created.id, order="asc")] == everything[1:]
    with pytest.raises(openai.NotFoundError):
        api.conversations.items.retrieve(everything[0], conversation_id=created.id)

    deleted = api.conversations.delete(created.id)
    assert deleted.id == created.id and deleted.deleted and deleted.object == "conversation.deleted"
    with pytest.raises(openai.NotFoundError):
        api.conversations.retrieve(created.id)


def test_an_item_is_kept_as_validated_with_its_id(http):
    conversation = http.post("/v1/conversations", json={}, headers=auth()).json()
    assert conversation["metadata"] == {}
    body = {"items": [{"role": "user", "content": [{"type": "input_text", "text": "a"}]}]}
    stored = http.post(f"/v1/conversations/{conversation['id']}/items", json=body, headers=auth()).json()["data"][0]
    assert stored == {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "a"}],
        "id": stored["id"],
        "status": "completed",
    }
    listed = http.get(f"/v1/conversations/{conversation['id']}/items?include=x&include[]=y", headers=auth()).json()
    assert listed["data"] == [stored]


def _conversation(http: TestClient, key: str = KEY_A) -> str:
    return str(
        http.post("/v1/conversations", json={"items": [{"role": "user", "content": "hi"}]}, headers=auth(key)).json()[
            "id"
        ]
    )


def _item(**extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": "x", **extra}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("", {"items": [_item() for _ in range(21)]}, "items"),
        ("/items", {"items": [_item() for _ in range(21)]}, "items"),
        ("/items", {"items": []}, "items"),
        ("/items", {}, "items"),
        ("", {"metadata": {str(n): "v" for n in range(17)}}, "metadata"),
        ("", {"metadata": {"k" * 65: "v"}}, "metadata"),
        ("/update", {"metadata": {"k": "v" * 513}}, "metadata"),
        ("/update", {}, "metadata"),
        ("", {"items": [{"type": "nope"}]}, "items[0].type"),
        ("/items", {"items": [{"role": "robot", "content": "x"}]}, "items[0].role"),
        ("/items", {"items": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "items[0].call_id"),
        ("/items", {"items": [_item(), _item(colour="red")]}, "items[1].colour"),
        (
            "/items",
            {"items": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "items[0].content[0].image_url",
        ),
        ("/items", {"items": "hello"}, "items"),
    ],
)
def test_a_request_past_openais_bounds_or_of_no_known_shape_is_a_400_naming_the_field(http, path, body, param):
    conversation = _conversation(http)
    url = "/v1/conversations" if path == "" else f"/v1/conversations/{conversation}{path.replace('/update', '')}"
    answer = http.post(url, json=body, headers=auth())
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    listed = http.get(f"/v1/conversations/{conversation}/items", headers=auth()).json()
    assert len(listed["data"]) == 1  # nothing added


@pytest.mark.parametrize("query", ["limit=0", "limit=101", "order=sideways"])
def test_list_parameters_out_of_bounds_are_a_400(http, query):
    answer = http.get(f"/v1/conversations/{_conversation(http)}/items?{query}", headers=auth())
    assert answer.status_code == 400 and answer.json()["error"]["type"] == "invalid_request_error"


def test_a_conversation_past_its_size_is_refused_with_a_400(tmp_path):
    with app(tmp_path, max_bytes=400) as http:
        conversation = _conversation(http)
        answer = http.post(
            f"/v1/conversations/{conversation}/items", json={"items": [_item(content="y" * 400)]}, headers=auth()
        )
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "items"


def test_another_keys_conversation_is_the_404_of_an_unknown_one(http):
    conversation = _conversation(http, KEY_A)
    item = http.get(f"/v1/conversations/{conversation}/items", headers=auth(KEY_A)).json()["data"][0]["id"]
    calls = [
        ("GET", ""),
        ("POST", ""),
        ("DELETE", ""),
        ("GET", "/items"),
        ("POST", "/items"),
        ("GET", f"/items/{item}"),
        ("DELETE", f"/items/{item}"),
    ]
    for method, tail in calls:
        body = {"metadata": {"k": "v"}} if tail == "" else {"items": [_item()]}
        kwargs: dict[str, Any] = {"json": body} if method == "POST" else {}
        foreign = http.request(method, f"/v1/conversations/{conversation}{tail}", headers=auth(KEY_B), **kwargs)
        unknown = http.request(method, f"/v1/conversations/{UNKNOWN}{tail}", headers=auth(KEY_B), **kwargs)
        assert foreign.status_code == unknown.status_code == 404, (method, tail)
        assert foreign.json() == _with_id(unknown.json(), UNKNOWN, conversation), (method, tail)
        assert foreign.json()["error"]["param"] == "conversation_id"
    with pytest.raises(openai.NotFoundError):
        client(http, KEY_B).conversations.retrieve(conversation)
    still = client(http, KEY_A).conversations.items.list(conversation)  # untouched
    assert [i.id for i in still.data] == [item]


def _with_id(body: dict[str, Any], unknown: str, known: str) -> dict[str, Any]:
    return {"error": {**body["error"], "message": body["error"]["message"].replace(unknown, known)}}


def test_without_a_store_the_routes_are_not_served():
    with app(None) as http:
        assert http.post("/v1/conversations", json={}, headers=auth()).status_code == 404
        assert not [p for p in http.app.openapi()["paths"] if p.startswith("/v1/conversations")]  # type: ignore[attr-defined]


def test_the_openapi_schema_has_the_routes_and_the_bounds(http):
    schema = http.get("/openapi.json").json()
    assert {
        "/v1/conversations",
        "/v1/conversations/{conversation_id}",
        "/v1/conversations/{conversation_id}/items",
        "/v1/conversations/{conversation_id}/items/{item_id}",
    } <= set(schema["paths"])
    create = schema["components"]["schemas"]["ConversationCreateRequest"]["properties"]
    assert create["items"]["anyOf"][0]["maxItems"] == 20
    metadata = next(branch for branch in create["metadata"]["anyOf"] if branch.get("type") == "object")
    assert metadata["maxProperties"] == 16 and metadata["additionalProperties"]["maxLength"] == 512


def prompt_of(decoder: FakeDecoder) -> str:
    """The text of the last chat the decoder was sent."""
    return json.dumps([m.model_dump() for m in decoder.requests[-1].messages])


def test_responses_on_a_conversation_read_its_items_and_add_each_turn_over_http_and_websocket(tmp_path):
    decoder = FakeDecoder(["Noted"])
    storage = LocalStorage(str(tmp_path))
    owners = stored_owners(storage)
    conversations = ConversationStore(storage, owners, 1_000_000)
    responses = StoredResponses(storage, owners, 1 << 20, 3600)
    health = HealthService(decoder, None, model_name="echo")
    models = ServedModels([ServedModel(ModelCard(id="echo", created=1), answer_core(decoder), health)])
    guard = GuardSettings.from_config(ServerConfig(api_keys=[KEY_A, KEY_B], api_keys_env=None))
    api_app = build_api(models, guard, FakeMetrics(), responses, conversations=conversations)
    with TestClient(api_app, base_url="http://test") as http:
        api = client(http)
        conversation = api.conversations.create(items=[{"role": "user", "content": "The code word is heron."}])
        first = api.responses.create(model="echo", input="Remember it.", conversation=conversation.id)
        assert first.conversation is not None and first.conversation.id == conversation.id
        assert "heron" in prompt_of(decoder)
        with http.websocket_connect("/v1/responses", headers=auth()) as socket:
            turn = {
                "type": "response.create",
                "model": "echo",
                "input": "And now?",
                "conversation": {"id": conversation.id},
            }
            socket.send_text(json.dumps(turn))
            while (event := json.loads(socket.receive_text()))["type"] not in ("response.completed", "error"):
                pass
        assert event["type"] == "response.completed", event
        assert "heron" in prompt_of(decoder) and "Remember it." in prompt_of(decoder)
        assert "Noted" in prompt_of(decoder)  # the first turn's answer, as the assistant's

        def kept() -> list[tuple[str, str]]:
            listed = api.conversations.items.list(conversation.id, order="asc", limit=100)
            return [(item.role, item.content[0].text) for item in listed]

        expected = [
            ("user", "The code word is heron."),
            ("user", "Remember it."),
            ("assistant", "Noted"),
            ("user", "And now?"),
            ("assistant", "Noted"),
        ]
        assert kept() == expected
        sent = len(decoder.requests)
        with pytest.raises(openai.BadRequestError) as both:
            api.responses.create(model="echo", input="x", conversation=conversation.id, previous_response_id=first.id)
        assert both.value.param == "conversation" and "Mutually exclusive" in both.value.message
        with pytest.raises(openai.NotFoundError):
            client(http, KEY_B).responses.create(model="echo", input="mine?", conversation=conversation.id)
        assert kept() == expected and len(decoder.requests) == sent  # refused turns: nothing sent, nothing added
        chained = api.responses.create(model="echo", input="Continue.", previous_response_id=first.id)
        assert "heron" in prompt_of(decoder) and chained.conversation is None  # the stored turn carries its history


def test_a_full_conversation_refuses_a_turn_before_it_generates_and_a_started_turn_is_added_whole(tmp_path):
    decoder = FakeDecoder(["x" * 400])
    storage = LocalStorage(str(tmp_path))
    conversations = ConversationStore(storage, stored_owners(storage), 600)
    health = HealthService(decoder, None, model_name="echo")
    models = ServedModels([ServedModel(ModelCard(id="echo", created=1), answer_core(decoder), health)])
    guard = GuardSettings.from_config(ServerConfig(api_keys_env=None))
    with TestClient(build_api(models, guard, FakeMetrics(), conversations=conversations), base_url="http://t") as http:
        api = openai.OpenAI(base_url="http://t/v1", api_key="none", http_client=http, max_retries=0)
        conversation = api.conversations.create()
        api.responses.create(model="echo", input="Go.", conversation=conversation.id)  # passes 600 bytes: kept whole
        assert len(list(api.conversations.items.list(conversation.id))) == 2
        with pytest.raises(openai.BadRequestError) as full:
            api.responses.create(model="echo", input="Again.", conversation=conversation.id)
        assert full.value.param == "conversation" and len(decoder.requests) == 1


def test_a_key_past_its_conversation_quota_gets_openais_400_and_a_delete_frees_its_place(tmp_path):
    with app(tmp_path, max_per_key=1) as http:
        first = client(http).conversations.create()
        refused = http.post("/v1/conversations", json={}, headers=auth())
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["type"] == "invalid_request_error" and "conversation quota" in error["message"]
        assert error["param"] is None and error["code"] is None
        client(http, KEY_B).conversations.create()  # another key's quota is its own
        client(http).conversations.delete(first.id)
        client(http).conversations.create()


def test_a_turn_on_a_conversation_of_a_key_past_its_bytes_is_refused_before_it_generates(tmp_path):
    decoder = FakeDecoder(["x" * 400])
    storage = LocalStorage(str(tmp_path))
    conversations = ConversationStore(storage, stored_owners(storage), 1_000_000, max_bytes_per_key=600)
    health = HealthService(decoder, None, model_name="echo")
    models = ServedModels([ServedModel(ModelCard(id="echo", created=1), answer_core(decoder), health)])
    guard = GuardSettings.from_config(ServerConfig(api_keys=[KEY_A, KEY_B], api_keys_env=None))
    with TestClient(
        build_api(models, guard, FakeMetrics(), conversations=conversations), base_url="http://test"
    ) as http:
        api = client(http)
        first, second = api.conversations.create(), api.conversations.create()
        api.responses.create(model="echo", input="Go.", conversation=first.id)  # passes 600 bytes: kept whole
        with pytest.raises(openai.BadRequestError) as full:
            api.responses.create(model="echo", input="Again.", conversation=second.id)  # the key's, not one's
        assert full.value.param == "conversation" and "storage quota" in full.value.message
        assert len(decoder.requests) == 1  # nothing generated for the refused turn
        with pytest.raises(openai.BadRequestError) as added:
            api.conversations.items.create(second.id, items=[{"role": "user", "content": "more"}])
        assert added.value.param == "items"
        other = client(http, KEY_B).conversations.create()
        client(http, KEY_B).responses.create(model="echo", input="Mine.", conversation=other.id)  # its own bytes
        api.conversations.delete(first.id)  # its bytes freed
        api.responses.create(model="echo", input="Again.", conversation=second.id)
        assert len(decoder.requests) == 3


class LoopWatchingStorage(LocalStorage):
    """A local root that notes each call made on a thread that runs an event loop."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.on_loop: list[str] = []

    def _watch(self, call: str) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self.on_loop.append(call)

    def read(self, path: str) -> bytes | None:
        self._watch("read")
        return super().read(path)

    def write(self, path: str, data: bytes | Iterable[bytes]) -> None:
        self._watch("write")
        super().write(path, data)

    def append(self, path: str, data: bytes) -> None:
        self._watch("append")
        super().append(path, data)

    def size(self, path: str) -> int | None:
        self._watch("size")
        return super().size(path)

    def names(self, directory: str) -> list[str]:
        self._watch("names")
        return super().names(directory)


def test_the_stores_storage_work_never_runs_on_the_event_loop(tmp_path):
    storage = LoopWatchingStorage(str(tmp_path))
    conversations = ConversationStore(storage, stored_owners(storage), 1_000_000)
    decoder = FakeDecoder(["Noted"])
    health = HealthService(decoder, None, model_name="echo")
    models = ServedModels([ServedModel(ModelCard(id="echo", created=1), answer_core(decoder), health)])
    guard = GuardSettings.from_config(ServerConfig(api_keys=[KEY_A, KEY_B], api_keys_env=None))
    with TestClient(
        build_api(models, guard, FakeMetrics(), conversations=conversations), base_url="http://test"
    ) as http:
        api = client(http)
        conversation = api.conversations.create(items=[{"role": "user", "content": "one"}], metadata={"k": "v"})
        added = api.conversations.items.create(conversation.id, items=[{"role": "user", "content": "two"}])
        api.responses.create(model="echo", input="three", conversation=conversation.id)
        list(api.conversations.items.list(conversation.id))
        api.conversations.items.retrieve(added.data[0].id, conversation_id=conversation.id)
        api.conversations.items.delete(added.data[0].id, conversation_id=conversation.id)
        api.conversations.update(conversation.id, metadata=None)
        api.conversations.retrieve(conversation.id)
        api.conversations.delete(conversation.id)
    assert storage.on_loop == []

"""The Responses API's WebSocket mode and /v1/responses/compact with a fake decoder, no Ray, through
the real app (Starlette's test client speaks the WebSocket protocol to it): turns one after the
other on one connection, the connection's memory of its last response (continuation, reconnect,
eviction after a failed turn), each turn's errors, the API key at the handshake, and compaction as
a summary that a new chain continues from."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse

from deployments.config import BatchesConfig, DocumentInputConfig, ImageInputConfig, ServerConfig
from deployments.config.limits import parse_limits
from deployments.ingress.api import build_api
from deployments.ingress.apis.counting import ROUTES
from deployments.ingress.apis.responses.compaction import transcript
from deployments.ingress.documents.stage import DocumentStage
from deployments.ingress.guard import GuardSettings
from deployments.ingress.health import HealthService
from deployments.ingress.limits.limiter import Limiter
from deployments.ingress.limits.table import KeyTable
from deployments.ingress.served_models import ServedModel, ServedModels
from deployments.protocol.openai.models import ModelCard
from deployments.protocol.openai.responses import ResponseCreateEvent
from deployments.state.batches import BatchStore
from deployments.state.owners import Caller
from deployments.state.records import stored_owners
from tests.support.stores import stored_responses, temporary_storage
from tests.unit.fake_metrics import FakeMetrics
from tests.unit.ingress.fakes import FakeDecoder, answer_core

TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


def app_client(decoder: FakeDecoder, keys: list[str] | None = None) -> TestClient:
    core = answer_core(decoder)
    served = ServedModels(
        [ServedModel(ModelCard(id="echo", created=1), core, HealthService(decoder, None, model_name="echo"))]
    )
    guard = GuardSettings.from_config(ServerConfig(api_keys_env=None, api_keys=keys or []))
    return TestClient(build_api(served, guard, FakeMetrics(), stored_responses()))


def turn(socket: Any, **body: Any) -> list[dict]:
    """Send one response.create; the messages of its answer, up to its last."""
    socket.send_text(json.dumps({"type": "response.create", "model": "echo", **body}))
    messages = [json.loads(socket.receive_text())]
    while messages[-1]["type"] not in TERMINAL or (messages[-1]["type"] == "error" and "status" not in messages[-1]):
        messages.append(json.loads(socket.receive_text()))
    return messages


def said(decoder: FakeDecoder) -> list[tuple[str, str]]:
    """What the decoder's last request had as its chat."""
    return [(m.role, m.content) for m in decoder.requests[-1].messages]


def test_turns_follow_one_another_on_one_connection_each_a_whole_stream():
    decoder = FakeDecoder(["Hel", "lo"])
    with app_client(decoder) as client, client.websocket_connect("/v1/responses") as socket:
        first = turn(socket, input="Reply with exactly: first", store=False)
        second = turn(socket, input="Reply with exactly: second", store=False)
    for messages in (first, second):
        assert [m["sequence_number"] for m in messages] == list(range(len(messages)))
        assert messages[0]["type"] == "response.created" and messages[-1]["type"] == "response.completed"
        assert "response.output_text.delta" in [m["type"] for m in messages]
        assert messages[-1]["response"]["output"][0]["content"][0]["text"] == "Hello"
    assert first[-1]["response"]["id"] != second[-1]["response"]["id"]
    assert first[-1]["response"]["store"] is False


def test_a_store_false_response_is_continued_on_its_connection_only():
    decoder = FakeDecoder(["OK."])
    with app_client(decoder) as client:
        with client.websocket_connect("/v1/responses") as socket:
            first = turn(socket, input="The code word is cobalt.", store=False)[-1]["response"]
            second = turn(socket, input="What is the code word?", store=False, previous_response_id=first["id"])
            assert second[-1]["type"] == "response.completed"
            assert said(decoder) == [
                ("user", "The code word is cobalt."),
                ("assistant", "OK."),
                ("user", "What is the code word?"),
            ]
            assert second[-1]["response"]["previous_response_id"] == first["id"]
        # Not stored: neither HTTP nor a new connection finds it.
        assert client.get(f"/v1/responses/{first['id']}").status_code == 404
        with client.websocket_connect("/v1/responses") as socket:
            missed = turn(socket, input="Again?", store=False, previous_response_id=first["id"])
            recovered = turn(socket, input="Start again.", store=False)
    assert missed == [
        {
            "type": "error",
            "status": 400,
            "error": {
                "message": missed[0]["error"]["message"],
                "type": "invalid_request_error",
                "param": "previous_response_id",
                "code": "previous_response_not_found",
            },
        }
    ]
    assert recovered[-1]["type"] == "response.completed"  # the connection stays open after an error


def test_a_failed_continuation_forgets_the_response_it_continued():
    decoder = FakeDecoder(["OK."])
    with app_client(decoder) as client, client.websocket_connect("/v1/responses") as socket:
        first = turn(socket, input="Remember: ember.", store=False)[-1]["response"]
        orphan = {"type": "function_call_output", "call_id": "call_missing", "output": "no such call"}
        failed = turn(socket, input=[orphan], store=False, previous_response_id=first["id"])
        retry = turn(socket, input="Continue.", store=False, previous_response_id=first["id"])
    assert failed[0]["status"] == 400 and failed[0]["error"]["param"] == "input[0].call_id"
    assert "call_missing" in failed[0]["error"]["message"]
    assert retry[0]["error"]["code"] == "previous_response_not_found"


def test_a_stored_response_is_found_from_another_connection_and_over_http():
    decoder = FakeDecoder(["Stored."])
    with app_client(decoder) as client:
        with client.websocket_connect("/v1/responses") as socket:
            first = turn(socket, input="Keep this.")[-1]["response"]
        assert client.get(f"/v1/responses/{first['id']}").json()["output"][0]["content"][0]["text"] == "Stored."
        with client.websocket_connect("/v1/responses") as socket:
            assert turn(socket, input="More.", previous_response_id=first["id"])[-1]["type"] == "response.completed"
        continued = client.post(
            "/v1/responses", json={"model": "echo", "input": "And?", "previous_response_id": first["id"]}
        )
        assert continued.status_code == 200


def test_an_error_mid_stream_is_an_error_event_then_response_failed_as_two_messages():
    decoder = FakeDecoder(["Hi", " there"], error=RuntimeError("boom"))
    decoder.fail_at = 1
    with app_client(decoder) as client, client.websocket_connect("/v1/responses") as socket:
        socket.send_text(json.dumps({"type": "response.create", "model": "echo", "input": "hi"}))
        messages = [json.loads(socket.receive_text())]
        while messages[-1]["type"] != "response.failed":
            messages.append(json.loads(socket.receive_text()))
        assert messages[-2]["type"] == "error" and messages[-2]["code"] == "server_error"
        decoder.error = None
        assert turn(socket, input="again")[-1]["type"] == "response.completed"


@pytest.mark.parametrize(
    ("message", "param", "words"),
    [
        ("not json", None, "not valid JSON"),
        ('["response.create"]', None, "JSON object"),
        ('{"type": "response.cancel"}', "type", "Unknown event type"),
        ('{"type": "response.create", "model": "echo", "input": "hi", "stream": true}', "stream", "WebSocket mode"),
        ('{"type": "response.create", "model": "echo", "input": "hi", "background": false}', "background", "WebSocket"),
        ('{"type": "response.create", "model": "nope", "input": "hi"}', "model", "nope"),
        ('{"type": "response.create", "model": "echo", "input": "hi", "generate": false}', "generate", "Extra"),
    ],
)
def test_a_bad_message_is_an_error_for_its_turn_and_the_connection_goes_on(message, param, words):
    with app_client(FakeDecoder(["OK."])) as client, client.websocket_connect("/v1/responses") as socket:
        socket.send_text(message)
        error = json.loads(socket.receive_text())
        assert error["type"] == "error" and error["status"] in (400, 404)
        assert error["error"]["param"] == param and words in error["error"]["message"]
        assert error["error"]["code"]  # always a code in WebSocket mode
        assert turn(socket, input="hi")[-1]["type"] == "response.completed"


def test_a_binary_message_is_read_as_text():
    with app_client(FakeDecoder(["OK."])) as client, client.websocket_connect("/v1/responses") as socket:
        socket.send_bytes(b"\xff\xfe")
        assert json.loads(socket.receive_text())["error"]["message"] == "The message is not valid JSON."
        socket.send_bytes(json.dumps({"type": "response.create", "model": "echo", "input": "hi"}).encode())
        assert json.loads(socket.receive_text())["type"] == "response.created"


def test_a_message_over_the_body_cap_is_a_413_for_its_turn():
    decoder = FakeDecoder(["OK."])
    client = app_client(decoder)
    with client, client.websocket_connect("/v1/responses") as socket:
        socket.send_text(
            json.dumps({"type": "response.create", "model": "echo", "input": "x" * (ServerConfig().max_body_bytes + 1)})
        )
        error = json.loads(socket.receive_text())
    assert (error["status"], error["error"]["code"]) == (413, "request_too_large") and not decoder.requests


def test_the_handshake_needs_an_api_key_as_a_request_does():
    with app_client(FakeDecoder(["OK."]), keys=["open-sesame"]) as client:
        with pytest.raises(WebSocketDenialResponse) as refused, client.websocket_connect("/v1/responses"):
            pass
        assert refused.value.status_code == 401 and refused.value.json()["error"]["code"] == "invalid_api_key"
        with client.websocket_connect("/v1/responses", headers={"Authorization": "Bearer open-sesame"}) as socket:
            assert turn(socket, input="hi")[-1]["type"] == "response.completed"


def test_the_create_event_becomes_a_streamed_request():
    event = ResponseCreateEvent.model_validate(
        {
            "type": "response.create",
            "model": "m",
            "input": "hi",
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}},
        }
    )
    request = event.request()
    assert request.stream is True and request.text is not None and request.text.format.type == "json_schema"
    assert not hasattr(request, "type")


def test_an_output_that_answers_no_call_is_a_400_over_http_too():
    with app_client(FakeDecoder()) as client:
        orphan = {"type": "function_call_output", "call_id": "c9", "output": "x"}
        answer = client.post("/v1/responses", json={"model": "echo", "input": [orphan]})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "input[0].call_id"


def test_compact_is_the_user_messages_and_the_summary_the_model_wrote():
    decoder = FakeDecoder(["Launch on Tuesday;", " notify support first."])
    conversation = [
        {"role": "user", "content": "We agreed to launch on Tuesday and notify support first."},
        {"role": "assistant", "content": "Understood. The launch is Tuesday."},
    ]
    with app_client(decoder) as client:
        answer = client.post(
            "/v1/responses/compact", json={"model": "echo", "input": conversation, "prompt_cache_key": "k"}
        )
        assert answer.status_code == 200
        compacted = answer.json()
        # The model read the conversation as a transcript to summarize.
        task = decoder.requests[-1].messages[-1].content
        assert "User: We agreed to launch on Tuesday" in task and "Assistant: Understood." in task
        assert decoder.requests[-1].temperature == 0
        assert compacted["object"] == "response.compaction" and compacted["id"].startswith("resp_")
        user, summary = compacted["output"]
        assert user["role"] == "user" and user["status"] == "completed" and user["id"].startswith("msg_")
        assert user["content"] == [{"type": "input_text", "text": conversation[0]["content"]}]
        assert (
            summary["type"] == "compaction"
            and summary["encrypted_content"] == "Launch on Tuesday; notify support first."
        )
        assert compacted["usage"]["input_tokens"] == 3 and compacted["usage"]["output_tokens"] == 2
        # A new chain continues from it: the summary is the assistant's turn before the new input.
        new = [*compacted["output"], {"role": "user", "content": "When do we launch?"}]
        with client.websocket_connect("/v1/responses") as socket:
            assert turn(socket, input=new, store=False)[-1]["type"] == "response.completed"
        assert said(decoder) == [
            ("user", conversation[0]["content"]),
            ("assistant", "Summary of our conversation so far: Launch on Tuesday; notify support first."),
            ("user", "When do we launch?"),
        ]


def test_compact_continues_a_stored_response_and_needs_a_model_and_something_to_compact():
    decoder = FakeDecoder(["Noted."])
    with app_client(decoder) as client:
        first = client.post("/v1/responses", json={"model": "echo", "input": "My name is Ada."}).json()
        compacted = client.post("/v1/responses/compact", json={"model": "echo", "previous_response_id": first["id"]})
        assert "User: My name is Ada.\nAssistant: Noted." in decoder.requests[-1].messages[-1].content
        assert [item["type"] for item in compacted.json()["output"]] == ["message", "compaction"]
        missing = client.post("/v1/responses/compact", json={"input": "Compact this."})
        empty = client.post("/v1/responses/compact", json={"model": "echo"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "input"


def test_a_transcript_names_tools_and_images():
    from deployments.protocol.openai.responses import ResponseRequest

    items = ResponseRequest.model_validate(
        {
            "model": "m",
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Look"},
                        {"type": "input_image", "image_url": "http://x/y.png"},
                    ],
                },
                {"type": "function_call", "call_id": "c", "name": "zoom", "arguments": '{"x": 1}'},
                {"type": "function_call_output", "call_id": "c", "output": "zoomed"},
            ],
        }
    ).items
    assert transcript("Be brief.", items) == (
        "Instructions: Be brief.\nUser: Look [an image]\n"
        'Assistant called the tool zoom with {"x": 1}\nTool result: zoomed'
    )


def test_a_connection_ends_after_its_lifetime_with_an_error_and_a_normal_close():
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocketDisconnect

    from deployments.ingress.answer.reply import Reply
    from deployments.ingress.apis.responses.socket import ResponseSocket

    async def unused(*args: Any) -> Reply:
        raise AssertionError("no turn is sent")

    async def endpoint(websocket):
        await ResponseSocket(
            websocket, unused, max_message_bytes=1024, request_id="ws", log=lambda record: None, lifetime_s=0.05
        ).run()

    app = Starlette(routes=[WebSocketRoute("/v1/responses", endpoint)])
    with TestClient(app) as client, client.websocket_connect("/v1/responses") as socket:
        expired = json.loads(socket.receive_text())
        with pytest.raises(WebSocketDisconnect) as closed:
            socket.receive_text()
    assert (expired["status"], expired["error"]["code"]) == (400, "websocket_connection_limit_reached")
    assert closed.value.code == 1000


def test_a_message_nested_too_deeply_is_a_400_for_its_turn_with_limits_or_without():
    from tests.unit.ingress.limits.test_limiter import LocalBoard

    deep = '{"type": "response.create", "model": "echo", "input": ' + "[" * 100_000 + "]" * 100_000 + "}"
    schema = '{"type": "object", "properties": {"a": ' * 300 + "{}" + "}}" * 300
    format_ = '{"format": {"type": "json_schema", "name": "deep", "schema": ' + schema + "}}"
    nested = '{"type": "response.create", "model": "echo", "input": "hi", "store": false, "text": ' + format_ + "}"
    decoder = FakeDecoder(["OK."])
    core = answer_core(decoder)
    served = ServedModels(
        [ServedModel(ModelCard(id="echo", created=1), core, HealthService(decoder, None, model_name="echo"))]
    )
    limits_file = "default: {requests_per_minute: 100, tokens_per_minute: 100000}"  # the estimate is read
    table = KeyTable(parse_limits(limits_file, "limits.yaml"), None, environ={})
    for limits in (None, table):
        guard = GuardSettings.from_config(ServerConfig(api_keys_env=None), extra_keys=limits)
        limiter = (
            None if limits is None else Limiter(table, LocalBoard(), served, {"echo": 64}, FakeMetrics(), routes=ROUTES)
        )
        app = build_api(served, guard, FakeMetrics(), stored_responses(), limiter=limiter)
        with TestClient(app) as client, client.websocket_connect("/v1/responses") as socket:
            socket.send_text(deep)
            error = json.loads(socket.receive_text())
            assert (error["type"], error["status"], error["error"]["type"]) == ("error", 400, "invalid_request_error")
            assert turn(socket, input="hi", store=False)[-1]["type"] == "response.completed"  # the connection goes on
            socket.send_text(nested)  # deep, but readable: a turn like any other
            assert json.loads(socket.receive_text())["type"] == "response.created"


def test_a_turn_reads_the_callers_own_file_and_no_other_keys():
    """A file named by `file_id` in a turn is the caller's, by the owner rule of HTTP: the key that
    uploaded it reads it, another key gets the same not found as for an unknown id."""
    key_a, key_b = "sk-socket-alice-0123", "sk-socket-bob-45678"
    storage = temporary_storage()
    batches = BatchStore.open(BatchesConfig(), storage, stored_owners(storage))
    stage = DocumentStage(DocumentInputConfig(), ImageInputConfig(), batches.files)
    decoder = FakeDecoder(["OK."])
    core = answer_core(decoder, documents=stage)
    served = ServedModels(
        [ServedModel(ModelCard(id="echo", created=1), core, HealthService(decoder, None, model_name="echo"))]
    )
    guard = GuardSettings.from_config(ServerConfig(api_keys_env=None, api_keys=[key_a, key_b]))
    app = build_api(served, guard, FakeMetrics(), stored_responses(), batch_service=batches)
    alice = Caller(hashlib.sha256(key_a.encode()).digest())
    uploaded = batches.files.create("notes.txt", b"The code word is cobalt.", "user_data", alice)
    content = [
        {"type": "input_file", "file_id": uploaded["id"]},
        {"type": "input_text", "text": "What is the code word?"},
    ]
    with TestClient(app) as client:
        headers = {"Authorization": f"Bearer {key_a}"}
        with client.websocket_connect("/v1/responses", headers=headers) as socket:
            answered = turn(socket, input=[{"role": "user", "content": content}], store=False)
        assert answered[-1]["type"] == "response.completed"
        assert "cobalt" in str(decoder.requests[-1].messages)
        headers = {"Authorization": f"Bearer {key_b}"}
        with client.websocket_connect("/v1/responses", headers=headers) as socket:
            refused = turn(socket, input=[{"role": "user", "content": content}], store=False)
        unknown = {**content[0], "file_id": "file-unknown"}
        with client.websocket_connect("/v1/responses", headers=headers) as socket:
            none = turn(socket, input=[{"role": "user", "content": [unknown, content[1]]}], store=False)
    assert refused[-1]["type"] == "error" and refused[-1]["status"] == 404 and len(decoder.requests) == 1
    assert refused[-1]["error"] == {**none[-1]["error"], "message": refused[-1]["error"]["message"]}
    assert none[-1]["error"]["message"].replace("file-unknown", uploaded["id"]) == refused[-1]["error"]["message"]

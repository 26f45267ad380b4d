"""Anthropic's Messages endpoint (`MessagesService` and its routes) with a fake decoder and a fake
captioner, no Ray: the request in chat form (system, tool results, images in them), the message and
its events (the same answer both ways, read by the official anthropic client), tool use, stop
reasons, usage with the prefix cache, count_tokens, a degraded answer, and errors in Anthropic's
shape and types (the guard's too, with the key by `x-api-key`)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import httpx2
import pytest

from deployments.config import ProxyVisionConfig, ServerConfig
from deployments.errors import OverloadedError
from deployments.ingress.api import build_api
from deployments.ingress.apis.messages.service import MessageBlocks, MessagesService
from deployments.ingress.guard import GuardSettings
from deployments.ingress.health import HealthService
from deployments.ingress.served_models import ServedModel, ServedModels
from deployments.ingress.vision.pipeline import DEGRADED_HEADER
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.anthropic import MessagesInput, MessagesRequest
from deployments.protocol.openai.models import ModelCard
from deployments.protocol.replica import GenerateChunk
from deployments.tools.plan import ToolPlan
from tests.conftest import png_bytes
from tests.unit.fake_metrics import FakeMetrics
from tests.unit.ingress.fakes import FakeCaptioner, FakeDecoder, answer_core

KEY = "sk-ant-test-0123"
BODY: dict[str, Any] = {"model": "echo", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL = ["Let me look.", '<tool_call>{"name": "get_weather", ', '"arguments": {"city": "Paris"}}</tool_call>']
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
IMAGE["source"]["data"] = __import__("base64").b64encode(png_bytes()).decode()  # type: ignore[index]


def api(
    decoder: FakeDecoder, captioner: FakeCaptioner | None = None, keys=(), metrics: FakeMetrics | None = None, **kw
) -> httpx.AsyncClient:
    core = answer_core(decoder, captioner, **kw)
    served = ServedModels(
        [ServedModel(ModelCard(id="echo", created=1), core, HealthService(decoder, captioner, model_name="echo"))]
    )
    guard = GuardSettings.from_config(ServerConfig(api_keys=list(keys), api_keys_env=None))
    app = build_api(served, guard, metrics or FakeMetrics())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def sdk(http: httpx.AsyncClient, key: str = KEY) -> anthropic.AsyncAnthropic:
    """The official client over the same app (it speaks through httpx2, httpx's successor)."""
    app = http._transport.app  # type: ignore[attr-defined]
    client = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test")
    return anthropic.AsyncAnthropic(base_url="http://test", api_key=key, http_client=client, max_retries=0)


def events(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.strip().split("\n\n"):
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        payload = json.loads(data.removeprefix("data: "))
        assert payload["type"] == name.removeprefix("event: ")
        out.append((payload["type"], payload))
    return out


async def test_a_message_in_one_body_and_its_events_say_the_same():
    decoder = FakeDecoder(["Hello", " there"])
    async with api(decoder) as http:
        reply = await http.post("/v1/messages", json=BODY, headers={"x-request-id": "abc", "anthropic-version": "x"})
        assert reply.status_code == 200
        assert reply.json() == {
            "id": "msg_abc",
            "type": "message",
            "role": "assistant",
            "model": "echo",
            "content": [{"type": "text", "text": "Hello there"}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": 3,
                "output_tokens": 2,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
            },
        }
        streamed = await http.post("/v1/messages", json={**BODY, "stream": True})
        assert streamed.headers["content-type"].startswith("text/event-stream")
        names = [name for name, _ in events(streamed.text)]
        assert names == [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
        client = sdk(http)
        whole = await client.messages.create(**BODY)
        async with client.messages.stream(**BODY) as stream:
            text = "".join([piece async for piece in stream.text_stream])
            final = await stream.get_final_message()
    assert text == "Hello there"
    assert final.model_dump(exclude={"id"}) == whole.model_dump(exclude={"id"})
    request = decoder.requests[0]
    assert (request.max_tokens, request.messages[0].role, request.messages[0].content) == (16, "user", "hi")


async def test_the_request_in_chat_form_with_sampling_settings():
    decoder = FakeDecoder()
    body = {
        **BODY,
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "bye"},
        ],
        "stop_sequences": ["END"],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 5,
        "metadata": {"user_id": "u1"},
    }
    async with api(decoder) as http:
        assert (await http.post("/v1/messages", json=body)).status_code == 200
    request = decoder.requests[0]
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", "Be brief. Be kind."),
        ("user", "hi"),
        ("assistant", "hello"),
        ("user", "bye"),
    ]
    assert (request.stop, request.temperature, request.top_p, request.top_k) == (["END"], 0.5, 0.9, 5)


async def test_a_tool_use_round_trip_whole_and_streamed():
    decoder = FakeDecoder(CALL)
    decoder.tool_format = "hermes"
    body = {**BODY, "tools": [WEATHER], "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    async with api(decoder) as http:
        client = sdk(http)
        whole = await client.messages.create(**body)
        async with client.messages.stream(**body) as stream:
            final = await stream.get_final_message()
        raw = await http.post("/v1/messages", json={**body, "stream": True})
    assert whole.stop_reason == "tool_use"
    assert [block.type for block in whole.content] == ["text", "tool_use"]
    call = whole.content[1]
    assert call.type == "tool_use" and (call.name, call.input) == ("get_weather", {"city": "Paris"})
    assert final.model_dump(exclude={"id"}, mode="json") == whole.model_dump(exclude={"id"}, mode="json") | {
        "content": [whole.content[0].model_dump(), {**call.model_dump(), "id": final.content[1].id}]
    }
    deltas = [e["delta"] for name, e in events(raw.text) if name == "content_block_delta"]
    arguments = "".join(d["partial_json"] for d in deltas if d["type"] == "input_json_delta")
    assert json.loads(arguments) == {"city": "Paris"}
    assert (
        decoder.requests[0].tools and decoder.requests[0].tools[0]["function"]["parameters"] == WEATHER["input_schema"]
    )


async def test_tool_results_go_back_as_tool_messages_with_their_images_seen():
    decoder, captioner = FakeDecoder(), FakeCaptioner()
    turns = [
        {"role": "user", "content": "Look at the screen."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "P"}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "sunny"}, IMAGE]},
                {"type": "tool_result", "tool_use_id": "t2", "content": "no such city", "is_error": True},
                {"type": "text", "text": "and now?"},
            ],
        },
    ]
    async with api(decoder, captioner) as http:
        reply = await http.post("/v1/messages", json={**BODY, "tools": [WEATHER], "messages": turns})
    assert reply.status_code == 200, reply.text
    messages = decoder.requests[0].messages
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool", "user"]
    assert messages[1].tool_calls and json.loads(messages[1].tool_calls[0].function.arguments) == {"city": "P"}
    assert (messages[2].tool_call_id, messages[2].content) == ("t1", "sunny")
    assert messages[3].content == "Error: no such city"
    assert "a picture for" in messages[4].content and "and now?" in messages[4].content
    assert len(captioner.calls) == 1


async def test_usage_reads_the_prefix_cache_and_count_tokens_counts_the_prompt_with_the_decoders_tokenizer():
    decoder = FakeDecoder(["ok"])
    decoder.cached = 2
    async with api(decoder) as http:
        usage = (await http.post("/v1/messages", json=BODY)).json()["usage"]
        counted = await http.post(
            "/v1/messages/count_tokens", json={k: v for k, v in BODY.items() if k != "max_tokens"}
        )
        also = await sdk(http).messages.count_tokens(model="echo", messages=BODY["messages"], system="Be brief.")
    assert usage["input_tokens"] == 1 and usage["cache_read_input_tokens"] == 2
    assert counted.status_code == 200 and counted.json() == {"input_tokens": len("hi")}  # the fake's: characters
    assert also.input_tokens == len("Be brief." + "hi")
    assert not decoder.requests[
        1:
    ]  # counted without a generation and decoder.tokenized[-1].messages[0].content == "Be brief."


def test_stop_reasons_from_the_decoders_last_chunk():
    def ended(**final: Any) -> Any:
        blocks = MessageBlocks("msg_1", "echo", ToolPlan(), None)
        blocks.feed(GenerateChunk(text="x", prompt_tokens=2, completion_tokens=1))
        blocks.feed(GenerateChunk(prompt_tokens=2, completion_tokens=1, **final))
        return blocks.message()

    assert ended(finish_reason="length").stop_reason == "max_tokens"
    stopped = ended(finish_reason="stop", stop_sequence="END")
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "END")
    assert (ended(finish_reason="stop").stop_reason, ended(finish_reason="stop").stop_sequence) == ("end_turn", None)


async def test_a_degraded_answer_says_so_as_a_chat_does():
    decoder = FakeDecoder()
    vision = ProxyVisionConfig(degraded_notice="[Image not seen.] ")
    image_turn = [{"role": "user", "content": [{"type": "text", "text": "see?"}, IMAGE]}]
    async with api(decoder, FakeCaptioner(down=True), vision=vision) as http:
        reply = await http.post("/v1/messages", json={**BODY, "messages": image_turn})
        streamed = await http.post("/v1/messages", json={**BODY, "messages": image_turn, "stream": True})
    assert reply.headers[DEGRADED_HEADER] == "captioner-unavailable"
    assert reply.json()["content"] == [{"type": "text", "text": "[Image not seen.] Hello there"}]
    assert reply.json()["vision"]["unseen_images"][0]["reason"] == "captioner_unavailable"
    start = events(streamed.text)[0][1]
    assert start["message"]["vision"]["degraded"] is True


@pytest.mark.parametrize(
    ("body", "status", "kind", "words"),
    [
        ({k: v for k, v in BODY.items() if k != "max_tokens"}, 400, "invalid_request_error", "max_tokens"),
        (
            {**BODY, "mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]},
            400,
            "invalid_request_error",
            "mcp",
        ),
        ({**BODY, "thinking": {"type": "sometimes"}}, 400, "invalid_request_error", "thinking.type"),
        ({**BODY, "model": "nope"}, 404, "not_found_error", "nope"),
        (
            {**BODY, "messages": [*BODY["messages"], {"role": "assistant", "content": "The"}]},
            400,
            "invalid_request_error",
            "prefill",
        ),
        ({**BODY, "messages": [{"role": "user", "content": []}]}, 400, "invalid_request_error", "messages[0].content"),
        ({**BODY, "tool_choice": {"type": "any"}}, 400, "invalid_request_error", "tool_choice"),
        (
            {**BODY, "messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x"}]}]},
            400,
            "invalid_request_error",
            "tool_result",
        ),
        (
            {**BODY, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            400,
            "invalid_request_error",
            "tools",
        ),
    ],
)
async def test_errors_in_anthropics_shape(body, status, kind, words):
    async with api(FakeDecoder()) as http:
        reply = await http.post("/v1/messages", json=body)
    assert reply.status_code == status
    assert reply.json()["type"] == "error" and reply.json()["error"]["type"] == kind
    assert words in reply.json()["error"]["message"]


async def test_keys_by_x_api_key_or_bearer_and_the_guards_errors_in_anthropics_shape():
    metrics = FakeMetrics()
    async with api(FakeDecoder(), keys=[KEY], metrics=metrics) as http:
        assert (await http.post("/v1/messages", json=BODY, headers={"x-api-key": KEY})).status_code == 200
        bearer = {"authorization": f"Bearer {KEY}"}
        assert (await http.post("/v1/messages", json=BODY, headers=bearer)).status_code == 200
        wrong = await http.post("/v1/messages", json=BODY, headers={"x-api-key": "nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
        chat = await http.post("/v1/chat/completions", json={"model": "echo", "messages": BODY["messages"]})
        assert chat.status_code == 401 and chat.json()["error"]["code"] == "invalid_api_key"  # OpenAI's shape there
        with pytest.raises(anthropic.AuthenticationError):
            await sdk(http, "nope").messages.create(**BODY)
        broken = await http.post(
            "/v1/messages", content=b"{", headers={"x-api-key": KEY, "content-type": "application/json"}
        )
        assert broken.status_code == 400 and broken.json()["error"]["type"] == "invalid_request_error"
        unknown = await http.post("/v1/messages", json={**BODY, "model": "nope"}, headers={"x-api-key": KEY})
        assert unknown.status_code == 404
    # Metrics name the route, and each error as on every route (its OpenAI code), whatever the body's shape.
    assert metrics.count("http_requests", route="/v1/messages", status="200") == 2
    assert metrics.count("requests_rejected", status="401", reason="invalid_api_key") >= 2
    assert metrics.count("requests_rejected", status="404", reason="model_not_found") == 1


async def test_overload_before_the_first_byte_and_an_error_event_after_it():
    async with api(FakeDecoder(error=OverloadedError("busy"))) as http:
        reply = await http.post("/v1/messages", json=BODY)
        assert reply.status_code == 503 and reply.json()["error"]["type"] == "overloaded_error"
        assert "Retry-After" in reply.headers
    late = FakeDecoder(["a", "b"], error=RuntimeError("boom"))
    late.fail_at = 2
    record = RequestRecord(request_id="r1")
    reply = await MessagesService(answer_core(late)).create(
        MessagesRequest.model_validate({**BODY, "stream": True}), record
    )
    assert reply.events is not None
    sent = events("".join([event async for event in reply.events]))
    assert sent[-1][0] == "error" and sent[-1][1]["error"]["type"] == "api_error"
    assert "r1" in sent[-1][1]["error"]["message"] and record.error_status == 500
    assert MessagesInput.model_validate(BODY).max_tokens == 16

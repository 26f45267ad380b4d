"""The Responses endpoint (`ResponseService` and its routes) with a fake decoder, no Ray: input items
as the decoder's chat, the output items and the semantic events, the official openai client
rebuilding from the stream the response it gets whole, the store (continuation, GET, DELETE,
input items) and the 400s that name what this server does not honour."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from deployments.config import ServerConfig
from deployments.ingress.api import build_api
from deployments.ingress.apis.responses.items import chat_messages
from deployments.ingress.guard import GuardSettings
from deployments.ingress.health import HealthService
from deployments.ingress.served_models import ServedModel, ServedModels
from deployments.protocol.openai.models import ModelCard
from deployments.protocol.openai.responses import ResponseRequest
from deployments.state.owners import Caller
from deployments.state.responses import StoredResponses
from tests.conftest import data_url, png_bytes
from tests.support.stores import stored_responses
from tests.unit.fake_metrics import FakeMetrics
from tests.unit.ingress.fakes import FakeCaptioner, FakeDecoder, answer_core

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def http(decoder: FakeDecoder, store: StoredResponses | None = None, captioner=None) -> httpx.AsyncClient:
    core = answer_core(decoder, captioner)
    health = HealthService(decoder, captioner, model_name="echo")
    guard = GuardSettings.from_config(ServerConfig(api_keys_env=None))
    served = ServedModels([ServedModel(ModelCard(id="echo", created=1), core, health)])
    api = build_api(served, guard, FakeMetrics(), store if store is not None else stored_responses())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://test")


def client(transport: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="none", http_client=transport, max_retries=0)


def request(**fields) -> ResponseRequest:
    return ResponseRequest.model_validate({"model": "echo", **fields})


def test_input_items_become_the_chat():
    image = data_url(png_bytes())
    body = request(
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Use tools."},
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "Look"}, {"type": "input_image", "image_url": image}],
            },
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Calling."}]},
            {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "shot", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_image", "image_url": image}]},
            {"role": "user", "content": "And now?"},
        ],
    )
    messages = chat_messages(body, [])
    assert [m.role for m in messages] == ["system", "developer", "user", "assistant", "tool", "tool", "user", "user"]
    assert messages[0].content == "Be brief."
    assert messages[3].content == "Calling." and [c.id for c in messages[3].tool_calls] == ["c1", "c2"]
    assert (messages[4].tool_call_id, messages[4].content) == ("c1", "done")
    assert [part.type for part in messages[6].content] == ["text", "image_url"]  # the tool's screenshot, as an image


def test_the_images_of_a_system_message_follow_it_in_a_user_turn():
    image = {"type": "input_image", "image_url": "http://x/y.png"}
    system = {"role": "system", "content": [{"type": "input_text", "text": "See:"}, image]}
    messages = chat_messages(request(input=[system, {"role": "user", "content": "hi"}]), [])
    assert [m.role for m in messages] == ["system", "user", "user"] and messages[0].content == "See:"
    assert [part.type for part in messages[1].content] == ["text", "image_url"]


async def test_a_response_whole_and_streamed_say_the_same():
    async with http(FakeDecoder(["Hello", " there"])) as transport:
        api = client(transport)
        whole = await api.responses.create(model="echo", input="hi", instructions="Be kind.", max_output_tokens=9)
        assert whole.status == "completed" and whole.id.startswith("resp_") and whole.object == "response"
        assert whole.output_text == "Hello there" and whole.instructions == "Be kind."
        assert whole.output[0].type == "message" and whole.output[0].content[0].annotations == []
        assert whole.usage.input_tokens == 3 and whole.usage.output_tokens == 2 and whole.usage.total_tokens == 5
        raw = (await transport.post("/v1/responses", json={"model": "echo", "input": "hi"})).json()
        # What the Open Responses schema requires of every response, null or not.
        required = {"completed_at", "top_p", "temperature", "presence_penalty", "frequency_penalty", "top_logprobs"}
        required |= {
            "max_tool_calls",
            "service_tier",
            "safety_identifier",
            "prompt_cache_key",
            "truncation",
            "reasoning",
        }
        assert required <= set(raw) and raw["completed_at"] >= raw["created_at"] and raw["top_p"] == 1.0
        async with api.responses.stream(
            model="echo", input="hi", instructions="Be kind.", max_output_tokens=9
        ) as stream:
            kinds = [event.type async for event in stream]
            streamed = await stream.get_final_response()
        assert streamed.output_text == whole.output_text and streamed.status == "completed"
        assert [item.type for item in streamed.output] == [item.type for item in whole.output]
        assert streamed.usage == whole.usage
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]


async def test_events_have_their_type_line_and_sequence_numbers_and_no_done():
    async with http(FakeDecoder(["Hi"])) as transport:
        reply = await transport.post("/v1/responses", json={"model": "echo", "input": "hi", "stream": True})
    events = [block.split("\n") for block in reply.text.strip().split("\n\n")]
    assert all(lines[0].startswith("event: ") and lines[1].startswith("data: ") for lines in events)
    data = [json.loads(lines[1][len("data: ") :]) for lines in events]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    assert [lines[0][len("event: ") :] for lines in events] == [d["type"] for d in data]
    assert "[DONE]" not in reply.text


async def test_function_calls_whole_and_streamed_and_their_output_round_trip():
    decoder = FakeDecoder([CALL[:30], CALL[30:]])
    decoder.tool_format = "hermes"
    async with http(decoder) as transport:
        api = client(transport)
        whole = await api.responses.create(model="echo", input="weather?", tools=[WEATHER])
        call = whole.output[0]
        assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
        assert json.loads(call.arguments) == {"city": "Paris"} and call.status == "completed"
        async with api.responses.stream(model="echo", input="weather?", tools=[WEATHER]) as stream:
            kinds = [event.type async for event in stream]
            streamed = await stream.get_final_response()
        assert streamed.output[0].arguments == call.arguments and streamed.output[0].name == "get_weather"
        assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
        decoder.pieces = ["Sunny."]
        follow = [
            {"role": "user", "content": "weather?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ]
        answer = await api.responses.create(model="echo", input=follow, tools=[WEATHER])
    assert answer.output_text == "Sunny."
    sent = decoder.requests[-1].messages
    assert [m.role for m in sent] == ["user", "assistant", "tool"] and sent[2].tool_call_id == call.call_id
    assert decoder.requests[-1].tools[0]["function"]["name"] == "get_weather"


async def test_max_output_tokens_makes_an_incomplete_response():
    decoder = FakeDecoder(["Hel", "lo"])
    async with http(decoder) as transport:
        api = client(transport)
        original = decoder._generate

        def cut(request):
            stream = original(request)
            stream._chunks[-1].finish_reason = "length"
            return stream

        decoder.generate.remote = cut
        whole = await api.responses.create(model="echo", input="hi", max_output_tokens=2)
        async with api.responses.stream(model="echo", input="hi", max_output_tokens=2) as stream:
            events = [event async for event in stream]  # the client's final response is only a completed one's
    streamed = events[-1].response
    assert events[-1].type == "response.incomplete" and whole.status == streamed.status == "incomplete"
    assert whole.incomplete_details.reason == streamed.incomplete_details.reason == "max_output_tokens"
    assert whole.output[0].status == "incomplete" and streamed.output_text == "Hello"


async def test_previous_response_id_get_input_items_and_delete():
    decoder = FakeDecoder(["One."])
    async with http(decoder) as transport:
        api = client(transport)
        first = await api.responses.create(model="echo", input="Count.", instructions="Be terse.", metadata={"k": "v"})
        decoder.pieces = ["Two."]
        second = await api.responses.create(model="echo", input="Again.", previous_response_id=first.id)
        assert second.previous_response_id == first.id and first.metadata == {"k": "v"}
        sent = decoder.requests[-1].messages
        assert [(m.role, m.content) for m in sent] == [("user", "Count."), ("assistant", "One."), ("user", "Again.")]
        got = await api.responses.retrieve(second.id)
        assert got.output_text == "Two." and got.id == second.id
        items = await api.responses.input_items.list(second.id)
        assert [item.content[0].text for item in items.data] == ["Again."] and items.data[0].id
        await api.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError) as missing:
            await api.responses.retrieve(first.id)
        assert missing.value.code == "response_not_found"
        with pytest.raises(openai.NotFoundError):
            await api.responses.delete(first.id)
        with pytest.raises(openai.BadRequestError) as gone:
            await api.responses.create(model="echo", input="More.", previous_response_id=first.id)
        assert gone.value.code == "previous_response_not_found" and gone.value.param == "previous_response_id"
        unstored = await api.responses.create(model="echo", input="Forget.", store=False)
        with pytest.raises(openai.NotFoundError):
            await api.responses.retrieve(unstored.id)


async def test_a_streamed_response_is_stored_before_its_last_event():
    store = stored_responses()
    async with http(FakeDecoder(["Hi"]), store) as transport:
        api = client(transport)
        async with api.responses.stream(model="echo", input="hi") as stream:
            async for event in stream:
                if event.type == "response.completed":
                    assert (await store.get(event.response.id, Caller())).thing is not None


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"tools": [{"type": "file_search"}], "tool_choice": {"type": "file_search"}}, "tool_choice", "cannot run"),
        ({"background": True}, "background", "background"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort", ""),
        ({"include": ["message.output_text.logprobs"]}, "include", "not supported"),
        ({"tools": [{"type": "web_search"}], "tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"truncation": "auto"}, "truncation", "disabled"),
        ({"conversation": "conv_1", "previous_response_id": "resp_1"}, "conversation", "Mutually exclusive"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]", ""),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tools": True}, "tools", ""),  # not a list: a 400, not the validator's TypeError (a 500)
    ],
)
async def test_what_is_not_honoured_is_a_400_naming_it(fields, param, words):
    async with http(FakeDecoder()) as transport:
        reply = await transport.post("/v1/responses", json={"model": "echo", "input": "hi", **fields})
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["type"] == "invalid_request_error"
    assert error["param"] is not None and error["param"].startswith(param) and words in error["message"]


async def test_an_unknown_model_is_a_404():
    async with http(FakeDecoder()) as transport:
        reply = await transport.post("/v1/responses", json={"model": "nope", "input": "hi"})
    assert reply.status_code == 404 and reply.json()["error"]["code"] == "model_not_found"


async def test_an_image_reaches_the_captioner_and_a_degraded_answer_says_so():
    image = {"type": "input_image", "image_url": data_url(png_bytes())}
    content = [{"type": "input_text", "text": "What is it?"}, image]
    decoder = FakeDecoder(["A cat."])
    async with http(decoder, captioner=FakeCaptioner()) as transport:
        reply = await transport.post(
            "/v1/responses", json={"model": "echo", "input": [{"role": "user", "content": content}]}
        )
        assert reply.status_code == 200 and "X-Vision-Degraded" not in reply.headers
        assert "a picture for" in decoder.requests[-1].messages[0].content
    async with http(decoder, captioner=FakeCaptioner(down=True)) as transport:
        reply = await transport.post(
            "/v1/responses", json={"model": "echo", "input": [{"role": "user", "content": content}]}
        )
    assert reply.status_code == 200 and reply.headers["X-Vision-Degraded"] == "captioner-unavailable"
    assert reply.json()["vision"]["degraded"] is True


async def test_an_error_mid_stream_is_an_error_event_then_response_failed():
    decoder = FakeDecoder(["Hi", " there"], error=RuntimeError("boom"))
    decoder.fail_at = 1
    async with http(decoder) as transport:
        reply = await transport.post("/v1/responses", json={"model": "echo", "input": "hi", "stream": True})
    types = [line[len("event: ") :] for line in reply.text.split("\n") if line.startswith("event: ")]
    assert types[-2:] == ["error", "response.failed"]

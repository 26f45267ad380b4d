"""OpenAI parity in the ingress, over the real FastAPI app with a fake decoder and no Ray: model
cards, n choices, logprobs, tools (auto, required, named, none), response_format, logit_bias, the
tool-call history, and the legacy /v1/completions endpoint; streamed answers say what whole ones say."""

from __future__ import annotations

import json

import pytest

from deployments.protocol.replica import GenerateRequest
from tests.conftest import data_url, png_bytes
from tests.unit.ingress.fakes import FakeCaptioner, FakeDecoder
from tests.unit.ingress.test_api import client

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL_TEXT = ["Let me check. ", "<tool_", 'call>{"name": "get_weather", ', '"arguments": {"city": "Paris"}}</tool_call>']


def chat(content: str = "hi", **extra) -> dict:
    return {"model": "echo", "messages": [{"role": "user", "content": content}], **extra}


def events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def streamed_calls(deltas: list[dict]) -> list[dict]:
    """A stream's tool calls as OpenAI's client adds them up: the first delta of a call has its id,
    type and name, the next ones only argument fragments (on the wire: no null fields)."""
    calls: list[dict] = []
    for delta in deltas:
        for piece in delta["delta"].get("tool_calls") or []:
            if piece["index"] == len(calls):
                assert piece["id"].startswith("call_") and piece["type"] == "function", piece
                calls.append({"id": piece["id"], "function": dict(piece["function"])})
            else:
                assert set(piece) == {"index", "function"} and set(piece["function"]) == {"arguments"}, piece
                calls[piece["index"]]["function"]["arguments"] += piece["function"]["arguments"]
    return calls


async def post(decoder: FakeDecoder, path: str, body: dict) -> tuple[dict | list[dict], GenerateRequest | None]:
    async with client(decoder) as http:
        reply = await http.post(path, json=body)
    sent = decoder.requests[-1] if decoder.requests else None
    if body.get("stream"):
        assert reply.status_code == 200 and reply.text.endswith("data: [DONE]\n\n")
        return events(reply.text), sent
    return reply.json() | {"status": reply.status_code}, sent


async def test_a_model_card_and_a_404_in_openai_shape():
    async with client(FakeDecoder()) as http:
        card = await http.get("/v1/models/echo")
        missing = await http.get("/v1/models/gpt-9")
    assert card.json() == {"id": "echo", "object": "model", "created": 1, "owned_by": "mmserve"}
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


async def test_n_choices_whole_and_streamed():
    whole, sent = await post(FakeDecoder(), CHAT, chat(n=2))
    assert sent is not None and sent.n == 2
    assert [(c["index"], c["message"]["content"]) for c in whole["choices"]] == [
        (0, "0:Hello there"),
        (1, "1:Hello there"),
    ]
    assert whole["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    chunks, _ = await post(FakeDecoder(), CHAT, chat(n=2, stream=True, stream_options={"include_usage": True}))
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == index]
        assert mine[0]["delta"]["role"] == "assistant"
        assert "".join(c["delta"].get("content", "") for c in mine) == whole["choices"][index]["message"]["content"]
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == ["stop"]
    assert chunks[-1]["usage"] == whole["usage"]


async def test_n_beyond_the_servers_maximum_is_a_400():
    reply, _ = await post(FakeDecoder(), CHAT, chat(n=9))
    assert reply["status"] == 400 and reply["error"]["param"] == "n"


async def test_logprobs_whole_and_streamed_are_the_same():
    whole, sent = await post(FakeDecoder(), CHAT, chat(logprobs=True, top_logprobs=2))
    assert sent is not None and sent.logprobs == 2
    content = whole["choices"][0]["logprobs"]["content"]
    assert [t["token"] for t in content] == ["Hello", " there"]
    assert all(len(t["top_logprobs"]) == 2 and t["top_logprobs"][0]["logprob"] == t["logprob"] for t in content)
    chunks, _ = await post(FakeDecoder(), CHAT, chat(logprobs=True, top_logprobs=2, stream=True))
    streamed = [t for c in chunks for t in ((c["choices"][0].get("logprobs") or {}).get("content") or [])]
    assert streamed == content
    plain, sent = await post(FakeDecoder(), CHAT, chat())
    assert sent is not None and sent.logprobs is None and plain["choices"][0]["logprobs"] is None


async def test_a_tool_call_in_the_models_text_is_parsed_whole_and_streamed():
    whole, sent = await post(FakeDecoder(CALL_TEXT), CHAT, chat("weather?", tools=[WEATHER]))
    assert sent is not None and sent.tools is not None and sent.tools[0]["function"]["name"] == "get_weather"
    assert sent.grammar is None  # auto: the model decides
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me check."
    call = choice["message"]["tool_calls"][0]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("get_weather", {"city": "Paris"})
    chunks, _ = await post(FakeDecoder(CALL_TEXT), CHAT, chat("weather?", tools=[WEATHER], stream=True))
    deltas = [c["choices"][0] for c in chunks]
    assert "".join(d["delta"].get("content") or "" for d in deltas) == "Let me check."
    assert [c["function"] for c in streamed_calls(deltas)] == [call["function"]]
    assert [d["finish_reason"] for d in deltas if d["finish_reason"]] == ["tool_calls"]


async def test_text_that_is_no_call_stays_content():
    pieces = ["I would use ", "<tool_call>not json</tool_call>", " here."]
    whole, _ = await post(FakeDecoder(pieces), CHAT, chat(tools=[WEATHER]))
    message = whole["choices"][0]["message"]
    assert message["content"] == "".join(pieces) and "tool_calls" not in message
    assert whole["choices"][0]["finish_reason"] == "stop"


async def test_required_and_named_tool_choice_constrain_the_output():
    """Both are constrained to the JSON list of calls (the generic format's call, in every format)."""
    output = ['[{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}]']
    one = chat(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    whole, sent = await post(FakeDecoder(output), CHAT, one)
    assert sent is not None and sent.grammar is not None and sent.grammar.kind == "json_schema"
    schema = json.loads(sent.grammar.json_schema or "")
    assert schema["type"] == "array" and schema["items"]["properties"]["name"] == {"const": "get_weather"}
    assert (schema["minItems"], schema["maxItems"]) == (1, 1) and sent.grammar.compact
    calls = whole["choices"][0]["message"]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Oslo"}]
    other = {**WEATHER, "function": {**WEATHER["function"], "name": "get_time"}}
    named = {"type": "function", "function": {"name": "get_weather"}}
    rome = ['[{"name": "get_weather", "arguments": ', '{"city": "Rome"}}]']
    whole, sent = await post(FakeDecoder(rome), CHAT, chat(tools=[other, WEATHER], tool_choice=named))
    assert sent is not None and sent.tools is not None and len(sent.tools) == 2
    schema = json.loads(sent.grammar.json_schema or "")
    assert schema["items"]["properties"] == {
        "name": {"const": "get_weather"},
        "arguments": {**WEATHER["function"]["parameters"], "additionalProperties": False},  # closed
    }
    call = whole["choices"][0]["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Rome"}
    assert whole["choices"][0]["message"]["content"] is None
    both = chat(tools=[other, WEATHER], tool_choice="required")  # parallel_tool_calls: true by default
    _, sent = await post(FakeDecoder(output), CHAT, both)
    schema = json.loads(sent.grammar.json_schema or "")
    assert len(schema["items"]["anyOf"]) == 2 and "maxItems" not in schema


@pytest.mark.parametrize(
    ("tool_format", "pieces"),
    [
        ("generic", ["  [{", '"name": "get_weather", "arguments": {"city":', ' "Paris"}}]']),
        ("llama3_json", ['{"name": "get_weather", ', '"parameters": {"city": "Paris"}}']),
        ("mistral", ["[TOOL_", 'CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]']),
        ("pythonic", ["[get_weather(", 'city="Paris")]']),
    ],
)
async def test_the_decoder_names_the_format_the_calls_are_read_in(tool_format, pieces):
    answers = []
    for stream in (False, True):
        decoder = FakeDecoder(pieces)
        decoder.tool_format = tool_format
        answers.append((await post(decoder, CHAT, chat("weather?", tools=[WEATHER], stream=stream)))[0])
    whole, chunks = answers
    call = whole["choices"][0]["message"]["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == ("get_weather", {"city": "Paris"})
    assert whole["choices"][0]["message"]["content"] is None and whole["choices"][0]["finish_reason"] == "tool_calls"
    deltas = [c["choices"][0] for c in chunks]
    assert "".join(d["delta"].get("content") or "" for d in deltas) == ""
    assert [c["function"] for c in streamed_calls(deltas)] == [call]
    hermes = FakeDecoder(pieces)  # not told: read as Hermes, where this is text
    assert (await post(hermes, CHAT, chat("weather?", tools=[WEATHER])))[0]["choices"][0]["message"]["content"]


async def test_a_repeated_call_ends_the_answer_and_its_generation():
    """`required` with parallel calls allowed (OpenAI's default): the model repeats its call; the
    answer ends at the first repeat (`tool_calls`, tokens counted up to there), whole and streamed,
    and the decoder's generation is cancelled."""
    call = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    pieces = ["[", call, ", ", call, ", ", call, "]"]
    body = chat(tools=[WEATHER], tool_choice="required", stream_options={"include_usage": True})
    whole_decoder, streamed_decoder = FakeDecoder(pieces), FakeDecoder(pieces)
    whole, _ = await post(whole_decoder, CHAT, {k: v for k, v in body.items() if k != "stream_options"})
    chunks, _ = await post(streamed_decoder, CHAT, body | {"stream": True})
    assert whole_decoder.streams[0].cancelled and streamed_decoder.streams[0].cancelled
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and whole["usage"]["completion_tokens"] == 4
    assert [json.loads(c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [{"city": "Oslo"}]
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    assert [c["function"] for c in streamed_calls(deltas)] == [choice["message"]["tool_calls"][0]["function"]]
    assert [d["finish_reason"] for d in deltas if d["finish_reason"]] == ["tool_calls"]
    assert chunks[-1]["usage"] == whole["usage"]


async def test_tool_choice_none_neither_renders_nor_parses():
    whole, sent = await post(FakeDecoder(CALL_TEXT), CHAT, chat(tools=[WEATHER], tool_choice="none"))
    assert sent is not None and sent.tools is None
    assert whole["choices"][0]["message"]["content"] == "".join(CALL_TEXT)


async def test_a_tool_round_trip_history_reaches_the_decoder():
    messages = [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"},
    ]
    _, sent = await post(FakeDecoder(), CHAT, {"model": "echo", "messages": messages, "tools": [WEATHER]})
    assert sent is not None
    assistant, tool = sent.messages[1], sent.messages[2]
    assert assistant.tool_calls is not None and assistant.tool_calls[0].function.name == "get_weather"
    assert (tool.role, tool.tool_call_id, tool.content) == ("tool", "call_1", "18 C, sunny")


@pytest.mark.parametrize(
    ("response_format", "kind"),
    [
        ({"type": "json_object"}, "json_object"),
        (
            {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}, "strict": True}},
            "json_schema",
        ),
    ],
)
async def test_response_format_becomes_the_decoders_grammar(response_format, kind):
    _, sent = await post(FakeDecoder(["{}"]), CHAT, chat(response_format=response_format))
    assert sent is not None and sent.grammar is not None and sent.grammar.kind == kind
    if kind == "json_schema":
        assert json.loads(sent.grammar.json_schema or "") == {"type": "object"}
    _, sent = await post(FakeDecoder(), CHAT, chat(response_format={"type": "text"}))
    assert sent is not None and sent.grammar is None


async def test_logit_bias_keys_are_token_ids():
    _, sent = await post(FakeDecoder(), CHAT, chat(logit_bias={"42": 5, "7": -100}))
    assert sent is not None and sent.logit_bias == {42: 5.0, 7: -100.0}
    reply, _ = await post(FakeDecoder(), CHAT, chat(logit_bias={"hello": 1}))
    assert reply["status"] == 400 and reply["error"]["param"] == "logit_bias"


async def test_legacy_completions_text_and_token_prompts():
    whole, sent = await post(FakeDecoder(), COMPLETIONS, {"model": "echo", "prompt": "Once upon"})
    assert sent is not None and (sent.prompt, sent.max_tokens, sent.messages) == ("Once upon", 16, [])
    assert whole["object"] == "text_completion" and whole["choices"][0]["text"] == "Hello there"
    _, sent = await post(FakeDecoder(), COMPLETIONS, {"model": "echo", "prompt": [1, 2, 3], "max_tokens": 4})
    assert sent is not None and sent.prompt == [1, 2, 3]


async def test_legacy_completions_several_prompts_n_echo_and_usage():
    body = {"model": "echo", "prompt": ["A", "B"], "n": 2, "echo": True}
    decoder = FakeDecoder()
    whole, _ = await post(decoder, COMPLETIONS, body)
    assert [r.prompt for r in decoder.requests] == ["A", "B"]
    assert [(c["index"], c["text"]) for c in whole["choices"]] == [
        (0, "A0:Hello there"),
        (1, "A1:Hello there"),
        (2, "B0:Hello there"),
        (3, "B1:Hello there"),
    ]
    assert whole["usage"] == {"prompt_tokens": 6, "completion_tokens": 8, "total_tokens": 14}
    chunks, _ = await post(FakeDecoder(), COMPLETIONS, {**body, "stream": True})
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert texts == {c["index"]: c["text"] for c in whole["choices"]}


async def test_legacy_logprobs_shape_and_refusals():
    whole, sent = await post(FakeDecoder(), COMPLETIONS, {"model": "echo", "prompt": "x", "logprobs": 2})
    assert sent is not None and sent.logprobs == 2
    logprobs = whole["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["Hello", " there"] and logprobs["text_offset"] == [0, 5]
    assert logprobs["token_logprobs"][0] == 0 and len(logprobs["top_logprobs"][0]) == 2
    for body, param in (
        ({"prompt": [1, 2], "echo": True}, "echo"),
        ({"prompt": "x", "echo": True, "logprobs": 1}, "echo"),
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "best_of": 2}, "best_of"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ):
        reply, _ = await post(FakeDecoder(), COMPLETIONS, {"model": "echo", **body})
        assert reply["status"] == 400 and reply["error"]["param"] == param, body


async def test_the_proxy_vision_path_gets_the_same_features():
    """Captions are part of the prompt; n, logprobs, tools and response_format apply as for text."""
    content = [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": data_url(png_bytes())}},
    ]
    body = chat(content, n=2, logprobs=True, tools=[WEATHER], response_format={"type": "json_object"})
    decoder = FakeDecoder(["{}"])
    async with client(decoder, captioner=FakeCaptioner()) as http:
        whole = (await http.post(CHAT, json=body)).json()
    sent = decoder.requests[-1]
    assert "Image 1: a picture for 'what is it?'" in sent.messages[0].content
    assert (sent.n, sent.logprobs, sent.grammar.kind if sent.grammar else None) == (2, 0, "json_object")
    assert sent.tools is not None and len(whole["choices"]) == 2
    assert all(c["logprobs"]["content"] for c in whole["choices"])

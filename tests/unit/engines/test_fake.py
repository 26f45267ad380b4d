"""The shipped deterministic engines (`engine: fake`): what the Serve tests rely on."""

from __future__ import annotations

import asyncio
import json
import time

import jsonschema
import pytest
from PIL import Image

from deployments.config import FakeEngineConfig, ModelConfig
from deployments.engines import create_caption_engine, create_text_engine
from deployments.errors import InvalidRequestError
from deployments.protocol.openai.common import ToolCall, ToolCallFunction
from deployments.protocol.replica import GenerateRequest, GrammarSpec, TextMessage


def ask(text: str, **kw) -> GenerateRequest:
    return GenerateRequest(messages=[TextMessage(role="user", content=text)], **kw)


async def pieces(engine, request):
    return [p async for p in engine.generate(request)]


async def test_echoes_its_prompt_word_by_word():
    engine = create_text_engine(ModelConfig(name="echo", engine="fake"))
    out = await pieces(engine, ask("tell me a story"))
    assert [p.text for p in out] == ["user:", " tell", " me", " a", " story", ""]
    assert out[-1].finish_reason == "stop" and (out[-1].prompt_tokens, out[-1].completion_tokens) == (5, 5)
    cut = await pieces(engine, ask("tell me a story", max_tokens=2))
    assert "".join(p.text for p in cut) == "user: tell" and cut[-1].finish_reason == "length"


async def test_fills_to_max_tokens_slowly_and_counts_its_live_generations():
    fake = FakeEngineConfig(token_delay_ms=20, fill_to_max_tokens=True)
    engine = create_text_engine(ModelConfig(name="slow", engine="fake", fake=fake))
    started = time.monotonic()
    task = asyncio.ensure_future(pieces(engine, ask("hi", max_tokens=5)))
    await asyncio.sleep(0.03)
    assert engine.stats() == {"running": 1, "waiting": 0}
    out = await task
    assert "".join(p.text for p in out) == "user: hi tick tick tick"
    assert out[-1].finish_reason == "length" and out[-1].completion_tokens == 5
    assert time.monotonic() - started >= 0.1 and engine.stats()["running"] == 0


def test_captions_by_the_top_left_pixel_and_repeats_the_prompt():
    engine = create_caption_engine(ModelConfig(name="cap", engine="fake"))
    images = [Image.new("RGB", (4, 4), (1, 2, 3)), Image.new("RGB", (2, 2), (9, 8, 7))]
    assert engine.caption(images, ["a", "b"]) == [
        "a picture whose corner is rgb(1, 2, 3) for: a",
        "a picture whose corner is rgb(9, 8, 7) for: b",
    ]


async def test_echoes_a_legacy_prompt_as_it_is():
    engine = create_text_engine(ModelConfig(name="echo", engine="fake"))
    out = await pieces(engine, GenerateRequest(prompt="once upon a time"))
    assert "".join(p.text for p in out) == "once upon a time" and out[-1].prompt_tokens == 4
    ids = await pieces(engine, GenerateRequest(prompt=[5, 7, 11]))
    assert "".join(p.text for p in ids) == "5 7 11"


def tool_call_history(tools: list[dict]) -> GenerateRequest:
    """A chat in which get_weather was called and its result came back."""
    call = ToolCall(id="call_1", function=ToolCallFunction(name="get_weather", arguments='{"city": "Paris"}'))
    messages = [
        TextMessage(role="user", content="Weather?"),
        TextMessage(role="assistant", content="", tool_calls=[call]),
        TextMessage(role="tool", content="18C", tool_call_id="call_1"),
    ]
    return GenerateRequest(messages=messages, tools=tools)


async def test_echoes_tools_and_a_tool_call_history():
    engine = create_text_engine(ModelConfig(name="echo", engine="fake"))
    request = tool_call_history(
        [{"type": "function", "function": {"name": "get_weather"}}, {"type": "function", "function": {"name": "f"}}]
    )
    text = "".join(p.text for p in await pieces(engine, request))
    assert text == (
        'tools: get_weather, f\nuser: Weather?\nassistant:  [called get_weather({"city": "Paris"}) as call_1]\n'
        "tool (call_1): 18C"
    )


async def test_answers_with_the_configured_tool_call_when_given_tools():
    fake = FakeEngineConfig(tool_call={"name": "get_weather", "arguments": {"city": "Paris"}})
    engine = create_text_engine(ModelConfig(name="tools", engine="fake", fake=fake))
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    text = "".join(p.text for p in await pieces(engine, ask("Weather?", tools=tools)))
    assert text == '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    assert "".join(p.text for p in await pieces(engine, ask("hi"))) == "user: hi"  # no tools: the echo
    answered = tool_call_history(tools)
    text = "".join(p.text for p in await pieces(engine, answered))  # the call's result is in: the loop ends
    assert text.endswith("tool (call_1): 18C") and "<tool_call>" not in text


@pytest.mark.parametrize(
    ("fmt", "written"),
    [
        ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'),
        ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
        ("pythonic", "[get_weather(city='Paris')]"),
        ("generic", '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    ],
)
async def test_the_tool_call_is_written_in_the_models_format(fmt, written):
    fake = FakeEngineConfig(tool_call={"name": "get_weather", "arguments": {"city": "Paris"}})
    model = ModelConfig(name="tools", engine="fake", fake=fake, capabilities={"tool_call_format": fmt})
    engine = create_text_engine(model)
    assert engine.tool_format == fmt
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    assert "".join(p.text for p in await pieces(engine, ask("Weather?", tools=tools))) == written


async def test_logprobs_are_one_sorted_entry_per_token():
    engine = create_text_engine(ModelConfig(name="echo", engine="fake"))
    out = await pieces(engine, ask("tell me a story", logprobs=3))
    entries = [e for p in out for e in p.logprobs]
    assert [e.token for e in entries] == [p.text for p in out[:-1]]
    assert [e.logprob for e in entries] == [0.0, -0.5, -1.0, 0.0, -0.5]
    for e in entries:
        assert [t.token for t in e.top_logprobs] == [e.token, " alt1", " alt2"]
        assert [t.logprob for t in e.top_logprobs] == [e.logprob, e.logprob - 1, e.logprob - 2]
        assert bytes(e.bytes).decode() == e.token
    assert all(e.top_logprobs == [] for p in await pieces(engine, ask("hi", logprobs=0)) for e in p.logprobs)
    assert all(p.logprobs == () for p in await pieces(engine, ask("hi")))


async def test_answers_a_grammar_with_a_fixed_json_document():
    engine = create_text_engine(ModelConfig(name="echo", engine="fake"))

    async def answer(grammar: GrammarSpec) -> str:
        return "".join(p.text for p in await pieces(engine, ask("hi", grammar=grammar)))

    assert await answer(GrammarSpec(kind="json_object")) == "{}"
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer", "minimum": 18},
            "tags": {"type": "array", "items": {"type": "string"}},
            "kind": {"enum": ["a", "b"]},
            "note": {"type": "string"},
        },
        "required": ["name", "age", "tags", "kind"],
    }
    document = json.loads(await answer(GrammarSpec(kind="json_schema", json_schema=json.dumps(schema))))
    assert document == {"name": "", "age": 18, "tags": [], "kind": "a"}
    jsonschema.validate(document, schema)
    example = {"type": "object", "example": {"x": 1}}
    assert json.loads(await answer(GrammarSpec(kind="json_schema", json_schema=json.dumps(example)))) == {"x": 1}
    with pytest.raises(InvalidRequestError) as err:
        await answer(GrammarSpec(kind="json_schema", json_schema="{not json"))
    assert err.value.param == "response_format"

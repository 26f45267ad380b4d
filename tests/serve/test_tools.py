"""Tools through real Serve with the official openai client: a real (tiny) model whose chat template
renders tools (Hermes, Qwen2.5's conventions) is constrained to a valid call under `required` and a
named function, and a round trip (call, tool result, answer) goes through; the fake engine's Hermes
answer is parsed under `auto`. Streamed equals whole under greedy decoding, tool calls included."""

from __future__ import annotations

import json
import shutil

import openai
import pytest

from tests.serve.conftest import BASE_URL, deploy, undeploy, write_models
from tests.unit.engines.test_tool_rendering import HERMES_TEMPLATE

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# A closed set of cities: the tiny model's weights are random, and a free string would run to max_tokens.
CITY = {"type": "string", "enum": ["Paris", "Oslo", "Rome"]}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": CITY},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def tiny(serve_cluster, tmp_path_factory, tiny_llm_dir):
    model_dir = tmp_path_factory.mktemp("tiny-tools")
    shutil.copytree(tiny_llm_dir, model_dir, dirs_exist_ok=True)
    (model_dir / "chat_template.jinja").write_text(HERMES_TEMPLATE)
    models = write_models(
        tmp_path_factory.mktemp("tools"),
        [{"name": "tools", "local_path": str(model_dir), "params": {"max_tokens": 48, "temperature": 0}}],
    )
    deploy(models, main="tools", route="/tools")
    yield openai.OpenAI(base_url=f"{BASE_URL}/tools/v1", api_key="unused", max_retries=0)
    undeploy("tools", "vision")


@pytest.fixture(scope="module")
def fake(serve_cluster, tmp_path_factory):
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    models = write_models(
        tmp_path_factory.mktemp("fake-tools"), [{"name": "echo", "engine": "fake", "fake": {"tool_call": call}}]
    )
    deploy(models, main="fake-tools", route="/fake")
    yield openai.OpenAI(base_url=f"{BASE_URL}/fake/v1", api_key="unused", max_retries=0)
    undeploy("fake-tools", "vision")


def calls_of_stream(client: openai.OpenAI, **request) -> tuple[list[tuple[str, str]], str | None]:
    calls, finish = [], None
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            calls += [(t.function.name, t.function.arguments) for t in choice.delta.tool_calls or []]
            finish = choice.finish_reason or finish
    return calls, finish


@pytest.mark.parametrize("parallel", [False, True])
def test_required_is_always_a_valid_call_streamed_as_whole(tiny, parallel):
    request = {
        "model": "tools",
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": parallel,
        "max_tokens": 200,
    }
    whole = tiny.chat.completions.create(**request)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls and (parallel or len(calls) == 1)
    for call in calls:
        assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in CITY["enum"]
    assert calls_of_stream(tiny, **request) == ([(c.function.name, c.function.arguments) for c in calls], "tool_calls")


def test_a_named_function_and_a_round_trip(tiny):
    named = {"type": "function", "function": {"name": "get_weather"}}
    first = tiny.chat.completions.create(
        model="tools", messages=ASK, tools=[WEATHER], tool_choice=named, max_tokens=200
    )
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in CITY["enum"]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"},
    ]
    answer = tiny.chat.completions.create(
        model="tools", messages=history, tools=[WEATHER], tool_choice="none", max_tokens=8
    )
    assert answer.choices[0].message.content and answer.choices[0].finish_reason in ("stop", "length")


def test_auto_parses_the_models_hermes_call(fake):
    request = {"model": "echo", "messages": ASK, "tools": [WEATHER]}
    whole = fake.chat.completions.create(**request)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert calls_of_stream(fake, **request) == ([(call.function.name, call.function.arguments)], "tool_calls")

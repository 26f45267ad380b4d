"""Tools through real Serve, with the official openai client and with LangChain's `ChatOpenAI`, as
agent frameworks call them:

- the offline default (SmolLM2-135M GGUF on its default engine, llama.cpp, on the CPU), whose
  template has no tools: the generic format. `auto` answers (never a 400), `required` and a named
  function are always a valid call, with parallel calls allowed too (OpenAI's default: the model's
  repeats of its call end the answer), a round trip (call, tool result, answer) goes through, and
  LangChain's `bind_tools`, `with_structured_output` in its three methods and a two-step agent
  loop work;
- a tiny model whose template renders tools (Hermes, Qwen2.5's conventions): the same calls in its
  own format;
- the fake engine's Hermes answer, parsed under `auto`.

Streamed equals whole under greedy decoding, tool calls included: the stream is added up by the
openai client's own accumulator (`ChatCompletionStreamState`), from argument fragments."""

from __future__ import annotations

import json
import shutil
from typing import Literal

import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from pydantic import BaseModel, Field

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
def smol(serve_cluster, tmp_path_factory, smollm2):
    """The offline default's model and engine (float32: batch-invariant, so answers are repeatable)."""
    params = {"max_tokens": 48, "temperature": 0, "max_num_seqs": 4, "stream_interval_ms": 0}
    entry = {"name": "smol", "local_path": str(smollm2.parent), "weight_file": smollm2.name, "params": params}
    models = write_models(tmp_path_factory.mktemp("smol-tools"), [entry])
    # On the CPU, one replica: the tiny and the fake decoders share the cluster's one fake GPU.
    deploy(models, main="smol-tools", route="/smol", decoder_gpus=0, decoder_cpu_replicas=1)
    yield openai.OpenAI(base_url=f"{BASE_URL}/smol/v1", api_key="unused", max_retries=0)
    undeploy("smol-tools", "vision")


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


MODELS = {"smol": "smol", "tiny": "tools"}


@pytest.fixture(params=["smol", "tiny"])
def served(request) -> tuple[openai.OpenAI, str]:
    """Each real model: (its client, its name)."""
    return request.getfixturevalue(request.param), MODELS[request.param]


def streamed(client: openai.OpenAI, **request) -> tuple[str, list[tuple[str, str]], str | None]:
    """The streamed answer as the openai client adds up its chunks."""
    state = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(stream=True, **request):
        state.handle_chunk(chunk)
    return whole_as_streamed(state.get_final_completion())


def whole_as_streamed(reply) -> tuple[str, list[tuple[str, str]], str | None]:
    choice = reply.choices[0]
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    return choice.message.content or "", calls, choice.finish_reason


def test_auto_on_a_template_without_tools_answers(smol):
    """The generic format: the 135M model mostly answers in text; never a 400."""
    request = {"model": "smol", "messages": ASK, "tools": [WEATHER], "max_tokens": 24}
    whole = smol.chat.completions.create(**request)
    assert whole.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert whole.choices[0].message.content or whole.choices[0].message.tool_calls
    assert streamed(smol, **request) == whole_as_streamed(whole)


@pytest.mark.parametrize("parallel", [False, True])
def test_required_is_always_a_valid_call_streamed_as_whole(served, parallel):
    client, model = served
    request = {
        "model": model,
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": parallel,
        "max_tokens": 200,
    }
    whole = client.chat.completions.create(**request)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls and (parallel or len(calls) == 1)
    for call in calls:
        assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in CITY["enum"]
    written = [(c.function.name, json.loads(c.function.arguments)) for c in calls]
    assert len(written) == len({json.dumps(w) for w in written}), written  # no call repeated
    assert streamed(client, **request) == whole_as_streamed(whole)


def test_a_forced_call_without_arguments_ends_with_parallel_calls_allowed(smol):
    """LangChain's `tool_calling_with_no_arguments`: `tool_choice` "any" (required) and parallel calls
    allowed; the 135M model writes the call, then the same one again: the answer ends there."""
    tool = {"type": "function", "function": {"name": "magic", "parameters": {"type": "object", "properties": {}}}}
    request = {
        "model": "smol",
        "messages": [{"role": "user", "content": "What is the value of magic_function?"}],
        "tools": [tool],
        "tool_choice": "required",
        "max_tokens": 200,
    }
    whole = smol.chat.completions.create(**request)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and whole.usage.completion_tokens < 200, whole
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [("magic", {})]
    assert streamed(smol, **request) == whole_as_streamed(whole)


def test_arguments_stream_as_fragments_that_add_up_to_the_call(smol):
    request = {
        "model": "smol",
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 64,
    }
    deltas = [
        call
        for chunk in smol.chat.completions.create(stream=True, **request)
        for choice in chunk.choices
        for call in choice.delta.tool_calls or []
    ]
    assert deltas[0].id and deltas[0].type == "function" and deltas[0].function.name == "get_weather"
    assert len(deltas) > 2 and all(d.id is None and d.function.name is None for d in deltas[1:])
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(arguments)["city"] in CITY["enum"]


def test_a_named_function_and_a_round_trip(served):
    client, model = served
    named = {"type": "function", "function": {"name": "get_weather"}}
    first = client.chat.completions.create(
        model=model, messages=ASK, tools=[WEATHER], tool_choice=named, max_tokens=200
    )
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in CITY["enum"]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"},
    ]
    for choice in ("auto", "none"):
        answer = client.chat.completions.create(
            model=model, messages=history, tools=[WEATHER], tool_choice=choice, max_tokens=16
        )
        message = answer.choices[0].message
        assert message.content or message.tool_calls


def test_auto_parses_the_models_hermes_call(fake):
    request = {"model": "echo", "messages": ASK, "tools": [WEATHER]}
    whole = fake.chat.completions.create(**request)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert streamed(fake, **request) == ("", [(call.function.name, call.function.arguments)], "tool_calls")


# --------------------------------------------------------------------------- LangChain


class Capital(BaseModel):
    """The capital city of a country."""

    city: Literal["Paris", "Oslo", "Rome"] = Field(description="The capital city")


def chat_model(client: openai.OpenAI, model: str):
    from langchain_openai import ChatOpenAI

    # The tiny model's random weights write JSON whitespace (up to 40 characters a gap): room for it.
    tokens = 64 if model == "smol" else 256
    return ChatOpenAI(base_url=str(client.base_url), api_key="unused", model=model, temperature=0, max_tokens=tokens)


def get_weather_tool():
    from langchain_core.tools import tool

    @tool
    def get_weather(city: Literal["Paris", "Oslo", "Rome"]) -> str:
        """The weather in a city."""
        return f"18 C and sunny in {city}"

    return get_weather


def test_langchain_bind_tools_and_a_two_step_agent_loop(served):
    """A forced call, its tool result, then the model's answer with the tools still bound (`auto`)."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    client, model = served
    llm, weather = chat_model(client, model), get_weather_tool()
    messages: list = [HumanMessage("What is the weather in Paris?")]
    first = llm.bind_tools([weather], tool_choice="any", parallel_tool_calls=False).invoke(messages)
    assert isinstance(first, AIMessage) and len(first.tool_calls) == 1, first
    call = first.tool_calls[0]
    assert call["name"] == "get_weather" and call["args"]["city"] in CITY["enum"]
    messages += [first, ToolMessage(weather.invoke(call["args"]), tool_call_id=call["id"])]
    final = llm.bind_tools([weather]).invoke(messages)
    assert isinstance(final, AIMessage) and (final.content or final.tool_calls)
    auto = llm.bind_tools([weather]).invoke([HumanMessage("Hello!")])  # the model decides: never a 400
    assert isinstance(auto, AIMessage)


def test_langchain_forced_calls_with_parallel_calls_allowed(served):
    """`bind_tools(tool_choice="any")` as LangChain's standard suite calls it: parallel calls are not
    turned off, and the answer is one call, not the same call until max_tokens."""
    from langchain_core.messages import AIMessage

    client, model = served
    out = chat_model(client, model).bind_tools([get_weather_tool()], tool_choice="any").invoke("Weather in Oslo?")
    assert isinstance(out, AIMessage) and out.tool_calls and not out.invalid_tool_calls, out
    assert len({json.dumps(c["args"], sort_keys=True) for c in out.tool_calls}) == len(out.tool_calls)


@pytest.mark.parametrize("method", ["function_calling", "json_schema", "json_mode"])
def test_langchain_structured_output(served, method):
    client, model = served
    if method == "json_mode" and model == "tools":
        pytest.skip("json_mode has no schema: the tiny model's random weights write JSON until max_tokens")
    question = "What is the capital of France? Answer in JSON with the key city."
    out = chat_model(client, model).with_structured_output(Capital, method=method).invoke(question)
    assert isinstance(out, Capital)

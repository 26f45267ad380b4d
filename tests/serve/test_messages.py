"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) through real Ray Serve, driven
by the official anthropic client: two models behind one endpoint (`model` picks), the fake engine
where the answer's words do not matter (it echoes what reached the decoder, so the request's chat
form is read back) and the offline default, llama.cpp's SmolLM2 GGUF, greedy; an API key sent as
Anthropic's clients send it (`x-api-key`). Whole and streamed answers (the stream's final message
equal to the whole one), a tool_use round trip with its tool_result, a forced tool call,
count_tokens, an image captioned by the fake captioner, and errors in Anthropic's shape."""

from __future__ import annotations

import base64
import json
import re
import subprocess

import anthropic
import httpx
import pytest

from tests.conftest import png_bytes
from tests.serve.conftest import BASE_URL, ROOT, deploy, undeploy, write_models

KEY = "sk-ant-serve-test"
GGUF = "smollm2-llamacpp"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
    },
}
IMAGE = {
    "type": "image",
    "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png_bytes()).decode()},
}


@pytest.fixture(scope="module")
def client(serve_cluster, tmp_path_factory, smollm2):
    models = write_models(
        tmp_path_factory.mktemp("messages"),
        [
            {
                "name": "echo",
                "engine": "fake",
                "fake": {"tool_call": CALL},
                "capabilities": {"vision_mode": "proxy", "captioner": "cap"},
            },
            {
                "name": GGUF,
                "local_path": str(smollm2.parent),
                "weight_file": smollm2.name,
                "params": {"max_tokens": 24, "max_model_len": 2048, "temperature": 0, "stream_interval_ms": 0},
            },
            {"name": "cap", "engine": "fake"},
        ],
        primaries=["echo", GGUF],
        server={"api_keys": [KEY]},
    )
    deploy(models, decoder_gpus=0, captioner_gpus=0)
    yield anthropic.Anthropic(base_url=BASE_URL, api_key=KEY, max_retries=0, timeout=120)
    undeploy("default", "vision")


def text_of(message: anthropic.types.Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def test_create_and_stream_say_the_same_on_the_fake_engine(client):
    request = {"model": "echo", "max_tokens": 64, "system": "Be brief.", "messages": ASK}
    whole = client.messages.create(**request)
    assert whole.type == "message" and whole.role == "assistant" and whole.model == "echo"
    assert whole.id.startswith("msg_") and whole.stop_reason == "end_turn"
    assert text_of(whole) == "system: Be brief.\nuser: What is the capital of France?"
    assert whole.usage.input_tokens > 0 and whole.usage.output_tokens > 0
    with client.messages.stream(**request) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == text_of(whole)
    assert final.model_dump(exclude={"id"}) == whole.model_dump(exclude={"id"})


def test_create_and_stream_on_the_offline_default(client):
    request = {"model": GGUF, "max_tokens": 12, "messages": ASK}
    whole = client.messages.create(**request)
    assert whole.model == GGUF and whole.stop_reason in ("end_turn", "max_tokens") and text_of(whole).strip()
    with client.messages.stream(**request) as stream:
        final = stream.get_final_message()
    assert text_of(final) == text_of(whole) and final.stop_reason == whole.stop_reason  # greedy
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.cache_read_input_tokens > 0  # the prompt's prefix, cached by the first call
    read = final.usage.input_tokens + final.usage.cache_read_input_tokens
    assert read == whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    counted = client.messages.count_tokens(model=GGUF, messages=ASK)
    assert counted.input_tokens == read
    word = text_of(whole).split()[1]  # greedy: the same answer again, cut before its second word
    stopped = client.messages.create(**request, stop_sequences=[word])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", word)
    assert text_of(stopped) == text_of(whole)[: text_of(whole).index(word)]


def test_a_tool_use_round_trip(client):
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    called = client.messages.create(model="echo", max_tokens=64, tools=[WEATHER], messages=ask)
    assert called.stop_reason == "tool_use"
    use = next(block for block in called.content if block.type == "tool_use")
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    assert re.fullmatch(r"toolu_\w+", use.id), use.id  # Anthropic's id form, as its clients expect
    with client.messages.stream(model="echo", max_tokens=64, tools=[WEATHER], messages=ask) as stream:
        streamed = stream.get_final_message()
    assert [(b.type, getattr(b, "input", None)) for b in streamed.content] == [
        (b.type, getattr(b, "input", None)) for b in called.content
    ]
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "18 C and sunny"}
    turns = [*ask, {"role": "assistant", "content": called.content}, {"role": "user", "content": [result]}]
    answered = client.messages.create(
        model="echo", max_tokens=128, tools=[WEATHER], tool_choice={"type": "none"}, messages=turns
    )
    assert answered.stop_reason == "end_turn"
    assert f"tool ({use.id}): 18 C and sunny" in text_of(answered)
    assert "[called get_weather(" in text_of(answered)


def test_a_forced_tool_call_on_the_offline_default(client):
    forced = client.messages.create(
        model=GGUF,
        max_tokens=48,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
    )
    uses = [block for block in forced.content if block.type == "tool_use"]
    assert forced.stop_reason == "tool_use" and uses and uses[0].name == "get_weather"
    assert isinstance(uses[0].input, dict) and isinstance(uses[0].input.get("city"), str)


def test_langchain_chat_anthropic_invokes_streams_and_binds_tools(client):
    """LangChain's `ChatAnthropic(base_url=...)`, as an agent builder points it at us: invoke and
    stream agree (the offline default, greedy), and a bound tool comes back as LangChain's tool call."""
    from langchain_anthropic import ChatAnthropic

    def chat(model: str) -> ChatAnthropic:
        return ChatAnthropic(model=model, base_url=BASE_URL, api_key=KEY, max_tokens=12, max_retries=0, timeout=120)

    whole = chat(GGUF).invoke("What is the capital of France?")
    assert isinstance(whole.content, str) and whole.content.strip()
    assert whole.response_metadata["stop_reason"] in ("end_turn", "max_tokens")
    assert whole.usage_metadata and whole.usage_metadata["output_tokens"] > 0
    streamed = "".join(str(chunk.content) for chunk in chat(GGUF).stream("What is the capital of France?"))
    assert streamed == whole.content
    called = chat("echo").bind_tools([WEATHER]).invoke("Weather in Paris?")
    assert [(call["name"], call["args"]) for call in called.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert called.tool_calls[0]["id"].startswith("toolu_")


def test_an_image_is_captioned_and_counted(client):
    turn = [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, IMAGE]}]
    answer = client.messages.create(model="echo", max_tokens=128, messages=turn)
    assert "Image 1:" in text_of(answer)  # the fake captioner's caption in place of the image
    counted = client.messages.count_tokens(model="echo", messages=turn)
    assert counted.input_tokens == answer.usage.input_tokens + answer.usage.cache_read_input_tokens


def test_errors_in_anthropics_shape(client):
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="echo", max_tokens=0, messages=ASK)
    assert bad.value.status_code == 400 and bad.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError) as servers:
        client.messages.create(
            model="echo", max_tokens=8, messages=ASK, extra_body={"mcp_servers": [{"type": "url", "url": "http://x"}]}
        )
    assert "mcp_servers" in servers.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client.messages.create(model="nope", max_tokens=8, messages=ASK)
    assert unknown.value.body["error"]["type"] == "not_found_error"
    wrong = anthropic.Anthropic(base_url=BASE_URL, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as denied:
        wrong.messages.create(model="echo", max_tokens=8, messages=ASK)
    assert denied.value.body["error"]["type"] == "authentication_error"
    raw = httpx.post(
        f"{BASE_URL}/v1/messages", content=b"{not json", headers={"x-api-key": KEY, "content-type": "application/json"}
    )
    assert raw.status_code == 400 and raw.json()["type"] == "error"


def test_the_docs_examples_run_against_this_deployment(client, capsys):
    """docs/messages.md's curl and Python blocks, pointed at this module's deployment (its URL, its
    key, the offline default's name here), as tests/serve/test_readme.py runs them against the README's."""
    page = (ROOT / "docs" / "messages.md").read_text()
    blocks = re.findall(r"^```(bash|python)\n(.*?)^```$", page, re.M | re.S)
    assert [lang for lang, _ in blocks] == ["bash", "python"]
    host = BASE_URL.removeprefix("http://")
    curl = blocks[0][1].replace("localhost:8000", host).replace("curl -s ", f"curl -sf -H 'x-api-key: {KEY}' ")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", curl.replace("smollm2-135m-instruct", GGUF)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and json.loads(done.stdout)["type"] == "message", done.stderr
    code = blocks[1][1].replace("http://127.0.0.1:8000", BASE_URL).replace('"unused"', repr(KEY))
    exec(compile(code.replace("smollm2-135m-instruct", GGUF), "docs/messages.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "get_weather" in printed and ("end_turn" in printed or "max_tokens" in printed)

"""vLLM's request extensions on /v1/chat/completions and /v1/completions: accepted at the body's top
level (where the openai client's `extra_body` puts them), carried to the decoder's request, and the
400s for what contradicts itself or is still not implemented."""

from __future__ import annotations

import httpx
import openai
import pytest

from deployments.config import ServerConfig
from deployments.ingress.api import build_api
from deployments.ingress.guard import GuardSettings
from deployments.ingress.health import HealthService
from deployments.ingress.served_models import ServedModel, ServedModels
from deployments.protocol.openai.models import ModelCard
from tests.unit.fake_metrics import FakeMetrics
from tests.unit.ingress.fakes import FakeDecoder, answer_core

CHAT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
EXTRAS = {
    "ignore_eos": True,
    "min_tokens": 3,
    "repetition_penalty": 1.3,
    "stop_token_ids": [7, 9],
    "skip_special_tokens": False,
    "include_stop_str_in_output": True,
    "priority": -5,
}


def http(decoder: FakeDecoder) -> httpx.AsyncClient:
    core = answer_core(decoder)
    health = HealthService(decoder, None, model_name="echo")
    guard = GuardSettings.from_config(ServerConfig(api_keys_env=None))
    served = ServedModels([ServedModel(ModelCard(id="echo", created=1), core, health)])
    api = build_api(served, guard, FakeMetrics())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://test")


def client(transport: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="none", http_client=transport, max_retries=0)


async def test_the_openai_clients_extra_body_reaches_the_decoder_on_chat():
    decoder = FakeDecoder(["Hi"])
    async with http(decoder) as transport:
        answer = await client(transport).chat.completions.create(
            model="echo",
            messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}],
            max_tokens=8,
            extra_body={
                **EXTRAS,
                "chat_template_kwargs": {"enable_thinking": False},
                "add_generation_prompt": False,
                "continue_final_message": True,
                "structured_outputs": {"choice": ["yes", "no"]},
            },
        )
    assert answer.choices[0].message.content == "Hi"
    sent = decoder.requests[0]
    assert {name: getattr(sent, name) for name in EXTRAS} == EXTRAS
    assert sent.chat_template_kwargs == {"enable_thinking": False}
    assert (sent.add_generation_prompt, sent.continue_final_message) == (False, True)
    assert sent.grammar is not None and (sent.grammar.kind, sent.grammar.choices) == ("choice", ["yes", "no"])
    assert sent.grammar.param == "structured_outputs"


async def test_the_openai_clients_extra_body_reaches_the_decoder_on_completions():
    decoder = FakeDecoder(["123"])
    async with http(decoder) as transport:
        await client(transport).completions.create(
            model="echo",
            prompt="Count:",
            max_tokens=8,
            extra_body={**EXTRAS, "structured_outputs": {"regex": "[0-9]+"}},
        )
    sent = decoder.requests[0]
    assert {name: getattr(sent, name) for name in EXTRAS} == EXTRAS
    assert sent.grammar is not None and (sent.grammar.kind, sent.grammar.pattern) == ("regex", "[0-9]+")


@pytest.mark.parametrize(
    ("outputs", "kind"),
    [
        ({"json": {"type": "object", "properties": {"a": {"type": "integer"}}}}, "json_schema"),
        ({"json": '{"type": "array"}'}, "json_schema"),
        ({"json_object": True}, "json_object"),
        ({"grammar": 'root ::= "a" | "b"'}, "grammar"),
    ],
)
async def test_structured_outputs_kinds_become_the_decoders_grammar(outputs, kind):
    decoder = FakeDecoder(["{}"])
    async with http(decoder) as transport:
        reply = await transport.post("/v1/chat/completions", json={**CHAT, "structured_outputs": outputs})
    assert reply.status_code == 200, reply.text
    assert decoder.requests[0].grammar is not None and decoder.requests[0].grammar.kind == kind


async def test_defaults_are_vllms():
    decoder = FakeDecoder(["Hi"])
    async with http(decoder) as transport:
        assert (await transport.post("/v1/chat/completions", json=CHAT)).status_code == 200
    sent = decoder.requests[0]
    assert (sent.min_tokens, sent.ignore_eos, sent.stop_token_ids, sent.priority) == (0, False, [], 0)
    assert (sent.skip_special_tokens, sent.include_stop_str_in_output, sent.repetition_penalty) == (True, False, None)
    assert (sent.add_generation_prompt, sent.continue_final_message, sent.grammar) == (True, False, None)


@pytest.mark.parametrize(
    ("path", "extra", "named"),
    [
        ("/v1/chat/completions", {"continue_final_message": True}, "add_generation_prompt"),
        (
            "/v1/chat/completions",
            {"continue_final_message": True, "add_generation_prompt": False},
            "assistant",
        ),
        (
            "/v1/chat/completions",
            {"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}},
            "response_format",
        ),
        ("/v1/chat/completions", {"structured_outputs": {"regex": "a", "choice": ["b"]}}, "exactly one"),
        ("/v1/chat/completions", {"structured_outputs": {}}, "exactly one"),
        ("/v1/chat/completions", {"structured_outputs": {"whitespace_pattern": " "}}, "whitespace_pattern"),
        ("/v1/chat/completions", {"min_tokens": 9, "max_completion_tokens": 4}, "min_tokens"),
        ("/v1/chat/completions", {"repetition_penalty": 0}, "repetition_penalty"),
        ("/v1/chat/completions", {"stop_token_ids": [-1]}, "stop_token_ids"),
        ("/v1/chat/completions", {"use_beam_search": True}, "use_beam_search"),
        ("/v1/completions", {"chat_template_kwargs": {"a": 1}}, "chat_template_kwargs"),
        ("/v1/completions", {"min_tokens": 20}, "min_tokens"),  # max_tokens defaults to 16 here
    ],
)
async def test_what_contradicts_itself_or_is_not_implemented_is_a_400_that_names_it(path, extra, named):
    body = {**CHAT, **extra} if "chat" in path else {"model": "echo", "prompt": "hi", **extra}
    async with http(FakeDecoder()) as transport:
        reply = await transport.post(path, json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert named in f"{error['message']} {error['param']}"


async def test_forced_tool_calls_and_structured_outputs_cannot_both_constrain_the_output():
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    body = {**CHAT, "tools": [tool], "tool_choice": "required", "structured_outputs": {"json_object": True}}
    async with http(FakeDecoder()) as transport:
        reply = await transport.post("/v1/chat/completions", json=body)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "structured_outputs"

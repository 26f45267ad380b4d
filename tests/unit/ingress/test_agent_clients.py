"""The two agent CLIs' requests as they really come (issue 48), replayed from their recorded bodies
through the official clients, with a fake decoder (no Ray): Codex CLI's /v1/responses request
(function tools, a `namespace` tool, a hosted `web_search`, reasoning settings, `include`,
`client_metadata`, `store: false`, streamed) and Claude Code's /v1/messages?beta=true (a system turn
among the messages, thinking, context_management, output_config, metadata, cache_control, the
`anthropic-beta` header, `max_tokens` 32,000); a namespaced call in the shape Codex reads and its
round trip; `max_tokens` clamped to the context left; a prompt too long in each API's words."""

from __future__ import annotations

import json
import logging
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from deployments.config import ServerConfig
from deployments.engines.context import Limits
from deployments.errors import ContextLengthError
from deployments.ingress.api import build_api
from deployments.ingress.apis.responses.items import Namespaces, flat_name, tool_plan
from deployments.ingress.guard import GuardSettings
from deployments.ingress.health import HealthService
from deployments.ingress.served_models import ServedModel, ServedModels
from deployments.protocol.openai.models import ModelCard
from deployments.protocol.openai.responses import ResponseRequest
from deployments.protocol.replica import GenerateRequest
from tests.support.agent_clients import claude_code_call, codex_call, recorded
from tests.support.stores import stored_responses
from tests.unit.fake_metrics import FakeMetrics
from tests.unit.ingress.fakes import FakeDecoder, FakeStream, answer_core

SPAWN = [
    '<tool_call>{"name": "multi_agent_v1__spawn_agent", ',
    '"arguments": {"message": "list the files"}}</tool_call>',
]
TOO_LONG = "This model's context is 8192 tokens; the prompt has 9500, which leaves no room for the completion."


def app(decoder: FakeDecoder, model: str) -> Any:
    core = answer_core(decoder, model_name=model)
    health = HealthService(decoder, None, model_name=model)
    served = ServedModels([ServedModel(ModelCard(id=model, created=1), core, health)])
    guard = GuardSettings.from_config(ServerConfig(api_keys_env=None))
    return build_api(served, guard, FakeMetrics(), stored_responses())


def codex(decoder: FakeDecoder) -> openai.AsyncOpenAI:
    transport = httpx.AsyncClient(transport=httpx.ASGITransport(app=app(decoder, "codex-agent")), base_url="http://t")
    return openai.AsyncOpenAI(base_url="http://t/v1", api_key="none", http_client=transport, max_retries=0)


def claude(decoder: FakeDecoder) -> anthropic.AsyncAnthropic:
    client = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app(decoder, "claude-agent")), base_url="http://t")
    return anthropic.AsyncAnthropic(base_url="http://t", api_key="none", http_client=client, max_retries=0)


def tool_names(request: GenerateRequest) -> list[str]:
    return [tool["function"]["name"] for tool in request.tools or []]


async def test_codex_first_request_streams_with_its_namespace_offered_and_web_search_set_aside(caplog):
    decoder = FakeDecoder(["Hello", " there."])
    client = codex(decoder)
    body = codex_call(recorded("codex_responses")["body"], client.responses.create)
    caplog.set_level(logging.INFO, logger="ray.serve")
    async with client.responses.with_streaming_response.create(**body) as raw:
        assert raw.headers["x-tools-set-aside"] == "web_search"
        events = [event async for event in await raw.parse()]
    assert [e.type for e in events][:2] == ["response.created", "response.in_progress"]
    final = events[-1]
    assert final.type == "response.completed"
    assert [item.type for item in final.response.output] == ["message"]  # no reasoning items
    assert final.response.output[0].content[0].text == "Hello there."
    sent = decoder.requests[0]
    assert tool_names(sent) == [
        "exec_command",
        "write_stdin",
        "request_user_input",
        "view_image",
        "multi_agent_v1__close_agent",
        "multi_agent_v1__resume_agent",
        "multi_agent_v1__send_input",
        "multi_agent_v1__spawn_agent",
        "multi_agent_v1__wait_agent",
        "get_goal",
        "create_goal",
        "update_goal",
    ]
    assert [m.role for m in sent.messages] == ["system", "system", "user", "user"]  # developer: system
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("access "))
    assert "set_aside=web_search" in line


async def test_a_namespaced_call_comes_back_as_codex_reads_it_and_round_trips():
    decoder = FakeDecoder(SPAWN)
    client = codex(decoder)
    body = codex_call(recorded("codex_responses")["body"], client.responses.create)
    stream = await client.responses.create(**body)
    events = [event async for event in stream]
    done = next(e for e in events if e.type == "response.output_item.done")
    call = done.item.model_dump()
    assert (call["type"], call["name"], call["namespace"]) == ("function_call", "spawn_agent", "multi_agent_v1")
    assert json.loads(call["arguments"]) == {"message": "list the files"}
    whole = await client.responses.create(**{**body, "stream": False})
    assert whole.output[0].model_dump()["namespace"] == "multi_agent_v1"

    # Codex's next request: the whole conversation again (store: false), the call as it came and its output.
    sent_back = {k: call[k] for k in ("type", "call_id", "name", "namespace", "arguments")}
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "agent a1 started"}
    decoder.pieces = ["Started."]
    next_turn = {**body, "input": [*body["input"], sent_back, output]}
    final = [e async for e in await client.responses.create(**next_turn)][-1]
    assert final.type == "response.completed" and final.response.output_text == "Started."
    messages = decoder.requests[-1].messages
    assert messages[-2].tool_calls[0].function.name == "multi_agent_v1__spawn_agent"
    assert (messages[-1].role, messages[-1].content) == ("tool", "agent a1 started")


async def test_a_tool_choice_that_forces_a_hosted_tool_is_the_only_400():
    client = codex(FakeDecoder())
    body = codex_call(recorded("codex_responses")["body"], client.responses.create)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(**{**body, "tool_choice": {"type": "web_search"}, "stream": False})
    assert refused.value.body["param"] == "tool_choice" and "cannot run" in refused.value.body["message"]


async def test_claude_code_first_request_streams_without_thinking_blocks():
    decoder = FakeDecoder(["Hello", " there."])
    client = claude(decoder)
    call = claude_code_call(recorded("claude_code_messages"))
    async with client.beta.messages.with_streaming_response.create(**call) as raw:
        assert raw.http_request.url.params["beta"] == "true"
        assert "context-management-2025-06-27" in raw.http_request.headers["anthropic-beta"]
        events = [event async for event in await raw.parse()]
    types = [e.type for e in events]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    blocks = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert blocks == ["text"]
    stop = next(e for e in events if e.type == "message_delta")
    assert stop.delta.stop_reason == "end_turn"
    sent = decoder.requests[0]
    assert [m.role for m in sent.messages] == ["system", "user"]  # the system turn (the last message) folded
    turn = call["messages"][1]["content"][0]["text"]
    assert sent.messages[0].content.startswith("x-anthropic-billing-header") and sent.messages[0].content.endswith(turn)
    assert "Bash" in tool_names(sent) and len(tool_names(sent)) == 21


class SmallContext(FakeDecoder):
    """A decoder whose context (100 tokens) holds a 60-token prompt, and which sizes each request's
    completion as the engines do (`engines.context.Limits`): `granted` says what each got."""

    granted: list[int]

    def _generate(self, request: GenerateRequest) -> FakeStream:
        limits = Limits(100, request.max_tokens, 10, ceiling=request.max_tokens_ceiling)
        try:
            self.granted.append(limits.completion(60))
            self.error = None
        except ContextLengthError as exc:
            self.error = exc
        return super()._generate(request)


async def test_claude_codes_max_tokens_is_clamped_to_what_the_context_leaves():
    decoder = SmallContext(["Hi."])
    decoder.granted = []
    call = {**claude_code_call(recorded("claude_code_messages")), "stream": False, "timeout": 30}
    message = await claude(decoder).beta.messages.create(**call)
    assert message.content[0].text == "Hi." and message.stop_reason == "end_turn"
    assert [(r.max_tokens, r.max_tokens_ceiling) for r in decoder.requests] == [(32000, True)]  # one call
    assert decoder.granted == [40]  # what 100 - 60 leaves


async def test_a_prompt_too_long_is_each_apis_own_context_error():
    decoder = FakeDecoder(error=ContextLengthError(TOO_LONG, param="messages"))
    call = claude_code_call(recorded("claude_code_messages"))
    with pytest.raises(anthropic.BadRequestError) as messages:
        await claude(decoder).beta.messages.create(**call)
    error = messages.value.body["error"]
    assert error == {"type": "invalid_request_error", "message": "prompt is too long: 9500 tokens > 8192 maximum"}
    client = codex(decoder)
    with pytest.raises(openai.BadRequestError) as responses:
        await client.responses.create(**codex_call(recorded("codex_responses")["body"], client.responses.create))
    assert responses.value.code == "context_length_exceeded"
    assert responses.value.body["type"] == "invalid_request_error"


def test_a_long_or_dotted_namespace_still_gives_the_model_a_function_name_and_comes_back_whole():
    long = "mcp__a_very_long_server_name_for_the_tools_of_a_team__"
    tools = [{"type": "function", "name": "list_pull_request_review_comments", "parameters": {"type": "object"}}]
    body = ResponseRequest.model_validate(
        {
            "model": "m",
            "input": "hi",
            "tools": [{"type": "namespace", "name": n, "tools": tools} for n in (long, "a.b")],
        }
    )
    names = [tool["function"]["name"] for tool in tool_plan(body).tools or []]
    assert all(len(name) <= 64 for name in names) and names[1] == "a_b__list_pull_request_review_comments"
    assert Namespaces(body).split(names[0]) == (long, "list_pull_request_review_comments")
    assert flat_name(long, "list_pull_request_review_comments") == names[0]

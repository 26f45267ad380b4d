"""The two agent CLIs through real Ray Serve (issue 48): their recorded request bodies replayed
through the official clients, streamed, as Codex CLI (/v1/responses, openai) and Claude Code
(/v1/messages?beta=true with its `anthropic-beta` flags, anthropic) send them, and Claude Code's
turn after its Read of a local PDF (the document in the tool result, issue 57). One deployment, two
fake models whose context (32,768 of the fake's word tokens) holds the recorded prompts, each
answering with a scripted call of one of its client's tools (a namespaced one for Codex): each
conversation completes a turn, the call round-trips (its result reaches the model), and a prompt
longer than the context gets the context error each client recognises."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tests.serve.conftest import BASE_URL, deploy, undeploy, wait_until, write_models
from tests.support.agent_clients import claude_code_call, codex_call, recorded

CONTEXT = 32768
LONG = " ".join(["word"] * (CONTEXT + 100))  # more fake tokens than the context holds


@pytest.fixture(scope="module")
def clients(serve_cluster, tmp_path_factory):
    params = {"max_model_len": CONTEXT, "max_tokens": 64}
    models = write_models(
        tmp_path_factory.mktemp("agents"),
        [
            {
                "name": "codex-agent",
                "engine": "fake",
                "fake": {"tool_call": {"name": "multi_agent_v1__spawn_agent", "arguments": {"message": "list files"}}},
                "params": params,
            },
            {
                "name": "claude-agent",
                "engine": "fake",
                "fake": {"tool_call": {"name": "Bash", "arguments": {"command": "ls"}}},
                "params": params,
            },
        ],
        primaries=["codex-agent", "claude-agent"],
    )
    deploy(models, decoder_gpus=0, captioner_gpus=0)
    assert wait_until(lambda: "codex-agent" in httpx.get(f"{BASE_URL}/v1/models", timeout=10).text)  # routed
    yield (
        openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key="none", max_retries=0, timeout=120),
        anthropic.Anthropic(base_url=BASE_URL, api_key="none", max_retries=0, timeout=120),
    )
    undeploy("default", "vision")


def test_codex_completes_a_turn_with_a_namespaced_call_and_gets_its_result_back(clients):
    client = clients[0]
    body = codex_call(recorded("codex_responses")["body"], client.responses.create)
    with client.responses.with_streaming_response.create(**body) as raw:
        assert raw.headers["x-tools-set-aside"] == "web_search"
        events = list(raw.parse())
    final = events[-1]
    assert final.type == "response.completed"
    call = final.response.output[0].model_dump()
    assert (call["type"], call["name"], call["namespace"]) == ("function_call", "spawn_agent", "multi_agent_v1")
    assert json.loads(call["arguments"]) == {"message": "list files"}

    sent_back = {key: call[key] for key in ("type", "call_id", "name", "namespace", "arguments")}
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "agent a1 started"}
    # The call's result is in: the scripted model answers (the fake echoes its prompt, which the test reads).
    turn = {**body, "input": [*body["input"], sent_back, output], "stream": False}
    echo = client.responses.create(**turn, max_output_tokens=20000)
    assert echo.status == "completed"
    assert f"[called multi_agent_v1__spawn_agent({call['arguments']}) as {call['call_id']}]" in echo.output_text
    assert f"tool ({call['call_id']}): agent a1 started" in echo.output_text


def test_claude_code_completes_a_turn_with_a_call_and_gets_its_result_back(clients):
    client = clients[1]
    call = claude_code_call(recorded("claude_code_messages"))
    events = list(client.beta.messages.create(**call))
    assert events[0].type == "message_start" and events[-1].type == "message_stop"
    assert not [e for e in events if e.type == "content_block_start" and e.content_block.type == "thinking"]
    use = next(e.content_block for e in events if e.type == "content_block_start")
    assert (use.type, use.name) == ("tool_use", "Bash")
    stop = next(e for e in events if e.type == "message_delta")
    assert stop.delta.stop_reason == "tool_use"

    turns = [
        *call["messages"],
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": use.id, "name": "Bash", "input": {"command": "ls"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "README.md"}]},
    ]
    echo = client.beta.messages.create(**{**call, "messages": turns, "stream": False})
    text = "".join(block.text for block in echo.content if block.type == "text")
    assert f"tool ({use.id}): README.md" in text
    assert echo.stop_reason == "end_turn"  # 32,000 tokens asked: clamped to what the context leaves, not a 400


def test_claude_code_reading_a_local_pdf_gets_its_pages_to_the_model(clients):
    # Claude Code's Read of a PDF hands it back as a base64 document block inside the tool result; the
    # model (the fake echoes its prompt once the tool has answered) reads the pages' text.
    call = claude_code_call(recorded("claude_code_pdf"))
    result = call["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and result["content"][1]["type"] == "document"
    with clients[1].beta.messages.stream(**{key: value for key, value in call.items() if key != "stream"}) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.stop_reason == "end_turn"
    assert "[document document 1, page 1 of 2]" in text
    assert "Quarterly report. Revenue grew 12 percent to 4.2 million." in text
    assert text.index("page 1 of 2") < text.index("Outlook: hiring two engineers in the spring.")


def test_a_prompt_longer_than_the_context_is_the_error_each_client_recognises(clients):
    codex_client, claude_client = clients
    body = codex_call(recorded("codex_responses")["body"], codex_client.responses.create)
    long_input = [*body["input"], {"type": "message", "role": "user", "content": LONG}]
    with pytest.raises(openai.BadRequestError) as responses:
        codex_client.responses.create(**{**body, "input": long_input})
    assert responses.value.code == "context_length_exceeded"

    call = claude_code_call(recorded("claude_code_messages"))
    turns = [*call["messages"], {"role": "user", "content": LONG}]
    with pytest.raises(anthropic.BadRequestError) as messages:
        claude_client.beta.messages.create(**{**call, "messages": turns})
    error = messages.value.body["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("prompt is too long: ") and error["message"].endswith(f" > {CONTEXT} maximum")

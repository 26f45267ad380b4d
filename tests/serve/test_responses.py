"""/v1/responses through real Ray Serve, driven by the official openai client: the fake engine
(echo, its Hermes tool call when a request brings tools, the fake captioner) where the answer's
words do not matter, and the offline default (SmolLM2 on llama.cpp) for a whole and a streamed
response that must say the same. Stored responses and conversations live in the storage root that
every ingress replica shares, and survive `serve shutdown`.

One deployment for the module: both models behind one endpoint, with two API keys (two tenants: a
stored response and a conversation are their key's alone)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from ray import serve

from tests.conftest import data_url, png_bytes
from tests.serve.conftest import BASE_URL, PORT, deploy, undeploy, write_models

ECHO, SMOL = "echo", "smollm2-llamacpp"
KEY_A, KEY_B = "key-tenant-a-0001", "key-tenant-b-0002"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def models(serve_cluster, tmp_path_factory, smollm2):
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    models = write_models(
        tmp_path_factory.mktemp("responses"),
        [
            {
                "name": ECHO,
                "engine": "fake",
                "fake": {"tool_call": call},
                "capabilities": {"vision_mode": "proxy", "captioner": "cap"},
            },
            {"name": "cap", "engine": "fake"},
            {
                "name": SMOL,
                "local_path": str(smollm2.parent),
                "weight_file": smollm2.name,
                "params": {"max_tokens": 64, "max_model_len": 2048, "temperature": 0, "stream_interval_ms": 0},
            },
        ],
        primaries=[ECHO, SMOL],
        server={"api_keys": [KEY_A, KEY_B]},
    )
    deploy(models, decoder_gpus=0, captioner_gpus=0)
    yield models
    undeploy("default", "vision")


@pytest.fixture(scope="module")
def client(models):
    return tenant(KEY_A)


def tenant(key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key=key, max_retries=0, timeout=120)


def test_llamacpp_whole_and_streamed_say_the_same(client):
    request = {"model": SMOL, "input": "What is the capital of France?", "instructions": "Answer in a few words."}
    whole = client.responses.create(**request)
    assert whole.status in ("completed", "incomplete") and whole.output_text
    assert whole.usage.input_tokens > 0 and whole.usage.output_tokens > 0
    with client.responses.stream(**request) as stream:
        events = list(stream)
    final = events[-1].response
    assert final.output_text == whole.output_text and final.status == whole.status
    assert [item.type for item in final.output] == [item.type for item in whole.output]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    raw = client.responses.create(stream=True, **request)
    assert "".join(e.delta for e in raw if e.type == "response.output_text.delta") == whole.output_text


def test_a_function_call_and_its_output_round_trip(client):
    first = client.responses.create(model=ECHO, input="Weather in Paris?", tools=[WEATHER])
    call = first.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    with client.responses.stream(model=ECHO, input="Weather in Paris?", tools=[WEATHER]) as stream:
        streamed = stream.get_final_response()
    assert streamed.output[0].arguments == call.arguments
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
    answer = client.responses.create(model=ECHO, input=[output], previous_response_id=first.id)
    assert "sunny, 21 C" in answer.output_text  # the echo shows the tool's output reached the model


def test_an_image_input_and_a_screenshot_from_a_tool_are_captioned(client):
    image = {"type": "input_image", "image_url": data_url(png_bytes())}
    seen = client.responses.create(
        model=ECHO, input=[{"role": "user", "content": [{"type": "input_text", "text": "What is it?"}, image]}]
    )
    assert seen.output_text and not getattr(seen, "vision", None)
    call = {"type": "function_call", "call_id": "c1", "name": "screenshot", "arguments": "{}"}
    shot = {"type": "function_call_output", "call_id": "c1", "output": [image]}
    after = client.responses.create(model=ECHO, input=[{"role": "user", "content": "Look."}, call, shot])
    assert after.status == "completed"


def test_previous_response_id_retrieve_input_items_and_delete(client):
    first = client.responses.create(model=ECHO, input="remember the word kumquat")
    second = client.responses.create(model=ECHO, input="which word?", previous_response_id=first.id)
    assert "kumquat" in second.output_text  # the echo holds the earlier turn
    assert client.responses.retrieve(second.id).output_text == second.output_text
    items = client.responses.input_items.list(second.id)
    assert [item.content[0].text for item in items.data] == ["which word?"]
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as gone:
        client.responses.create(model=ECHO, input="more", previous_response_id=first.id)
    assert gone.value.code == "previous_response_not_found" and gone.value.param == "previous_response_id"


def test_a_stored_response_is_its_keys_alone(client):
    """Another key reads, lists, continues (over HTTP and the WebSocket), compacts and deletes the
    response exactly as an unknown id; the owner's response stays whole and theirs to continue."""
    secret = client.responses.create(model=ECHO, input="My secret is 4471.")
    other = tenant(KEY_B)
    unknown_id = "resp_" + "0" * 24

    def refused(call, rid: str) -> tuple[int, dict, set[str]]:
        with pytest.raises(openai.APIStatusError) as caught:
            call(rid)
        response = caught.value.response
        names = {n.lower() for n in response.headers} - {"date", "x-request-id", "content-length"}
        return response.status_code, _without_id(response.json(), rid), names

    for call in (other.responses.retrieve, other.responses.input_items.list, other.responses.delete):
        assert refused(call, secret.id) == refused(call, unknown_id)
        assert refused(call, secret.id)[0] == 404
    for how in (
        lambda rid: other.responses.create(model=ECHO, input="And?", previous_response_id=rid),
        lambda rid: other.responses.compact(model=ECHO, previous_response_id=rid),
    ):
        assert refused(how, secret.id) == refused(how, unknown_id)
    assert refused(how, secret.id)[1]["error"]["code"] == "previous_response_not_found"
    with other.responses.connect() as connection:
        theirs = socket_turn(connection, model=ECHO, input="And?", previous_response_id=secret.id)
        nobodys = socket_turn(connection, model=ECHO, input="And?", previous_response_id=unknown_id)
    assert [e.type for e in theirs] == [e.type for e in nobodys] == ["error"]
    assert theirs[0].error.code == nobodys[0].error.code == "previous_response_not_found"
    assert "4471" in client.responses.retrieve(secret.id).output_text
    assert "4471" in client.responses.create(model=ECHO, input="Again?", previous_response_id=secret.id).output_text
    client.responses.delete(secret.id)


def _without_id(body: dict, rid: str) -> dict:
    return json.loads(json.dumps(body).replace(rid, "<id>"))


def test_errors_name_what_is_wrong(client):
    with pytest.raises(openai.NotFoundError) as unknown:
        client.responses.create(model="gpt-9", input="hi")
    assert unknown.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as hosted:
        client.responses.create(
            model=ECHO, input="hi", tools=[{"type": "web_search"}], tool_choice={"type": "web_search"}
        )
    assert hosted.value.param == "tool_choice" and "cannot run" in hosted.value.message
    bad = httpx.post(
        f"{BASE_URL}/v1/responses",
        json={"model": ECHO, "input": [{"type": "message", "role": "tool"}]},
        headers={"Authorization": f"Bearer {KEY_A}"},
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("input[0]")


def agent(model: str, **settings: object):
    """An Agents SDK agent on its default model (the Responses API) with one function tool, ending
    at the tool's output."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, function_tool, set_tracing_disabled

    set_tracing_disabled(True)

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    client = openai.AsyncOpenAI(base_url=f"{BASE_URL}/v1", api_key=KEY_A, max_retries=0, timeout=120)
    return Agent(
        name="weather",
        instructions="Answer briefly; use the tool for the weather.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=model, openai_client=client),
        model_settings=ModelSettings(**settings),
        tool_use_behavior="stop_on_first_tool",
    )


@pytest.mark.parametrize(("model", "settings"), [(ECHO, {}), (SMOL, {"tool_choice": "required"})])
async def test_an_agents_sdk_agent_calls_its_tool_whole_and_streamed(client, model, settings):
    """The fake calls the tool when a request has tools and no tool result yet. The offline default (135M) is made to:
    unforced, it answers in words ("The weather in Paris is quite unique."), and once it has the
    tool's output it tends to ramble on to max_tokens, which the SDK takes as a failed turn."""
    from agents import Runner

    whole = await Runner.run(agent(model, **settings), "Weather in Paris?")
    assert whole.final_output.startswith("sunny in")
    streamed = Runner.run_streamed(agent(model, **settings), "Weather in Paris?")
    async for _ in streamed.stream_events():
        pass
    assert streamed.final_output == whole.final_output


def socket_turn(connection, **body: object) -> list:
    """One response.create on an open WebSocket connection (the openai client's): its events, up
    to its last."""
    connection.response.create(**body)
    events = []
    for event in connection:
        events.append(event)
        if event.type in ("response.completed", "response.incomplete", "response.failed", "error"):
            return events
    raise AssertionError("the connection closed in the middle of a turn")


def test_websocket_turns_continue_on_their_connection_only(client):
    """The openai client's WebSocket mode through Serve's proxy: turns one after the other on one
    connection, a store: false response continued there, and not after a reconnect."""
    with client.responses.connect() as connection:
        first = socket_turn(connection, model=ECHO, input="the code word is cobalt", store=False)
        second = socket_turn(
            connection, model=ECHO, input="which word?", store=False, previous_response_id=first[-1].response.id
        )
        other = socket_turn(connection, model=SMOL, input="Say hello.", max_output_tokens=8)
    assert [e.sequence_number for e in first] == list(range(len(first)))
    assert first[-1].type == second[-1].type == "response.completed"
    assert "cobalt" in second[-1].response.output_text  # the echo holds the earlier turn
    assert other[-1].type in ("response.completed", "response.incomplete") and other[-1].response.output_text
    with client.responses.connect() as connection:
        missed = socket_turn(
            connection, model=ECHO, input="again?", store=False, previous_response_id=first[-1].response.id
        )
        recovered = socket_turn(connection, model=ECHO, input="start over", store=False)
    assert missed[-1].type == "error" and missed[-1].status == 400
    assert missed[-1].error.code == "previous_response_not_found"
    assert recovered[-1].type == "response.completed"


def test_compact_on_the_offline_default_and_a_new_chain_from_it(client):
    """The 135M model writes the summary; a new WebSocket chain starts from the compacted output."""
    conversation = [
        {"role": "user", "content": "We agreed to launch on Tuesday and notify support first."},
        {"role": "assistant", "content": "Understood. The launch is Tuesday, with support notified beforehand."},
    ]
    compacted = client.responses.compact(model=SMOL, input=conversation)
    assert compacted.object == "response.compaction"
    assert [item.type for item in compacted.output] == ["message", "compaction"]
    assert compacted.output[-1].encrypted_content  # the summary, in plain text
    assert compacted.usage.input_tokens > 0 and compacted.usage.output_tokens > 0
    # The client types the kept user messages (input_text) as output messages: no warnings for that.
    following = [item.model_dump(exclude_none=True, warnings=False) for item in compacted.output]
    with client.responses.connect() as connection:
        events = socket_turn(
            connection, model=ECHO, input=[*following, {"role": "user", "content": "When?"}], store=False
        )
    assert (
        "Summary of our conversation so far: " + compacted.output[-1].encrypted_content
        in events[-1].response.output_text
    )


def said(response) -> str:
    return response.output[0].content[0].text


def test_a_conversation_and_a_chain_survive_serve_shutdown_and_stay_their_keys(models):
    """Five turns on a conversation (`conversation=`) and a chain (`previous_response_id`), with
    `serve shutdown` and a new deployment after the second turn: the later prompts carry the earlier
    turns (the echo model answers with its prompt), the conversation holds each turn's input and
    output once, in order, and another key finds neither."""
    a, b = tenant(KEY_A), tenant(KEY_B)
    conversation = a.conversations.create(metadata={"topic": "colours"})
    turns = [f"turn {i}: colour{i}" for i in range(1, 6)]
    answers = []
    chain = [a.responses.create(model=ECHO, input="chain one: amber")]
    for i, text in enumerate(turns):
        if i == 2:
            chain.append(a.responses.create(model=ECHO, input="chain two: teal", previous_response_id=chain[0].id))
            serve.shutdown()  # every replica gone, and Serve with them
            serve.start(http_options={"host": "127.0.0.1", "port": PORT})
            deploy(models, decoder_gpus=0, captioner_gpus=0)
        answers.append(said(a.responses.create(model=ECHO, input=text, conversation=conversation.id)))
    for i, answer in enumerate(answers):
        assert all(earlier in answer for earlier in turns[: i + 1]), (i, answer)
        assert not any(later in answer for later in turns[i + 1 :]), (i, answer)
    continued = a.responses.create(model=ECHO, input="chain three", previous_response_id=chain[1].id)
    assert "amber" in said(continued) and "teal" in said(continued)

    items = list(a.conversations.items.list(conversation.id, order="asc", limit=100))
    assert [item.role for item in items] == ["user", "assistant"] * 5
    assert [item.content[0].text for item in items[::2]] == turns
    assert [item.content[0].text for item in items[1::2]] == answers
    assert len({item.id for item in items}) == 10
    assert a.conversations.retrieve(conversation.id).metadata == {"topic": "colours"}

    for call in (
        lambda: b.conversations.retrieve(conversation.id),
        lambda: b.conversations.items.list(conversation.id),
        lambda: b.responses.create(model=ECHO, input="mine?", conversation=conversation.id),
        lambda: b.responses.retrieve(chain[1].id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError) as foreign:
        b.responses.create(model=ECHO, input="mine?", previous_response_id=chain[1].id)
    assert foreign.value.code == "previous_response_not_found"
    with pytest.raises(openai.BadRequestError) as both:
        a.responses.create(model=ECHO, input="x", conversation=conversation.id, previous_response_id=chain[1].id)
    assert both.value.param == "conversation"
    assert len(list(a.conversations.items.list(conversation.id, limit=100))) == 10  # the refused turns added nothing

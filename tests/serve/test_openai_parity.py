"""OpenAI parity through real Serve with the official openai client and the real offline model
(SmolLM2-135M GGUF): model cards, logprobs, n, structured output and the legacy completions endpoint
(tools: test_tools.py). Under greedy decoding a streamed answer equals the whole one, logprobs
included."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.serve.conftest import BASE_URL, deploy, undeploy, write_models

MODEL = "smollm2"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def client(serve_cluster, tmp_path_factory, smollm2):
    models = write_models(
        tmp_path_factory.mktemp("parity"),
        [
            {
                "name": MODEL,
                "local_path": str(smollm2.parent),
                "weight_file": smollm2.name,
                "params": {"max_tokens": 40, "max_num_seqs": 4, "stream_interval_ms": 0},
            }
        ],
    )
    deploy(models)
    yield openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key="unused", max_retries=0)
    undeploy("default", "vision")


def streamed(client: openai.OpenAI, **request) -> tuple[str, list, str | None]:
    """A streamed answer's text, logprobs and finish reason, put together."""
    text, logprobs, finish = "", [], None
    for chunk in client.chat.completions.create(stream=True, **request):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            logprobs += (choice.logprobs.content or []) if choice.logprobs else []
            finish = choice.finish_reason or finish
    return text, logprobs, finish


def test_a_model_card_and_a_404(client):
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-9")
    assert err.value.code == "model_not_found"


def test_logprobs_are_consistent_and_streamed_equals_whole(client):
    request = {"model": MODEL, "messages": ASK, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    whole = client.chat.completions.create(**request)
    tokens = whole.choices[0].logprobs.content
    assert len(tokens) == whole.usage.completion_tokens
    assert "".join(t.token for t in tokens).strip().startswith(whole.choices[0].message.content.strip()[:5])
    for token in tokens:
        assert len(token.top_logprobs) == 3 and token.logprob <= 0
        values = [alt.logprob for alt in token.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert token.top_logprobs[0].token == token.token  # greedy: the chosen token is the most likely
        assert token.top_logprobs[0].logprob == pytest.approx(token.logprob)
        assert bytes(token.bytes).decode(errors="replace") or token.token == ""
    text, logprobs, finish = streamed(client, **request)
    assert (text, finish) == (whole.choices[0].message.content, whole.choices[0].finish_reason)
    assert [(t.token, t.logprob) for t in logprobs] == [(t.token, t.logprob) for t in tokens]


def test_n_choices_are_indexed_and_added_up(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, n=3, temperature=1.0, max_tokens=8)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert 3 <= reply.usage.completion_tokens <= 24
    greedy = client.chat.completions.create(model=MODEL, messages=ASK, n=2, temperature=0)
    assert greedy.choices[0].message.content == greedy.choices[1].message.content  # independent, same greedy path


def test_json_schema_output_parses_and_validates(client):
    request = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Invent a person. Answer in JSON with name and age."}],
        "temperature": 0,
        "max_tokens": 60,
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
    }
    whole = client.chat.completions.create(**request)
    person = json.loads(whole.choices[0].message.content)
    jsonschema.validate(person, PERSON)
    assert streamed(client, **request)[0] == whole.choices[0].message.content


def test_json_object_output_parses(client):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Answer in JSON: what color is the sky? Use the key color."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=120,
    )
    assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_an_invalid_schema_is_a_400(client):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ASK, response_format=bad)
    assert err.value.body["param"] == "response_format"


def test_legacy_completions(client):
    whole = client.completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=2
    )
    choice = whole.choices[0]
    assert choice.text and len(choice.logprobs.tokens) == whole.usage.completion_tokens
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs)
    text = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True
        )
        if c.choices
    )
    assert text == choice.text
    echoed = client.completions.create(
        model=MODEL, prompt=["Paris is", "Rome is"], max_tokens=3, temperature=0, echo=True
    )
    assert [c.text.split(" is")[0] for c in echoed.choices] == ["Paris", "Rome"]

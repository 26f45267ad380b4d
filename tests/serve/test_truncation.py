"""`context_overflow: truncate` through the real service in proxy mode: the echo decoder (`engine:
fake`, a word per token, its context checked when `max_model_len` is set) answers with the prompt
it read, and the fake captioner captions by pixel colour, so the answer shows exactly which turns
and captions the decoder saw: whole turns dropped from the oldest, every caption whole or absent."""

from __future__ import annotations

import json

import pytest

from tests.conftest import data_url, png_bytes
from tests.serve.conftest import deploy, echo_with_captioner, undeploy, write_models

SYSTEM = "You see images as text."
COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
WORDS = ["first", "second", "third"]


def caption(n: int) -> str:
    """The fake captioner's caption of image n (1-based), as the rewrite numbers it."""
    prompt = "Describe this image in one or two sentences."  # the default captioning prompt
    return f"Image {n}: a picture whose corner is rgb{COLOURS[n - 1]} for: {prompt}"


def conversation(max_tokens: int) -> dict:
    messages: list[dict] = [{"role": "system", "content": SYSTEM}]
    for i, word in enumerate(WORDS):
        image = {"type": "image_url", "image_url": {"url": data_url(png_bytes(COLOURS[i]))}}
        messages.append({"role": "user", "content": [{"type": "text", "text": f"the {word} picture"}, image]})
        if i < len(WORDS) - 1:
            messages.append({"role": "assistant", "content": f"Answer {i}."})
    return {"model": "echo", "messages": messages, "max_tokens": max_tokens, "temperature": 0}


def turn(i: int) -> list[str]:
    lines = [f"user: the {WORDS[i]} picture", caption(i + 1)]
    return [*lines, f"assistant: Answer {i}."] if i < len(WORDS) - 1 else lines


@pytest.fixture(scope="module")
def service(serve_cluster, tmp_path_factory):
    """In words: the whole chat is 73, without its first turn 50, with only its last 27; the decoder's
    context is 110."""
    models = echo_with_captioner(None)
    models[0]["params"] = {"max_tokens": 4096, "max_model_len": 110, "context_overflow": "truncate"}
    deploy(write_models(tmp_path_factory.mktemp("truncate"), models))
    yield
    undeploy("default", "vision")


@pytest.mark.parametrize(("max_tokens", "kept", "dropped"), [(55, [1, 2], 23), (70, [2], 46)])
def test_truncation_drops_whole_turns_and_keeps_every_caption_whole(service, http, max_tokens, kept, dropped):
    response = http.post("/v1/chat/completions", json=conversation(max_tokens))
    assert response.status_code == 200, response.text
    body = response.json()
    echo = body["choices"][0]["message"]["content"]
    assert echo.splitlines() == [f"system: {SYSTEM}", *(line for i in kept for line in turn(i))]
    for n, colour in enumerate(COLOURS, 1):  # each caption whole, or not there at all
        assert (caption(n) in echo) == (f"rgb{colour}" in echo) == (n - 1 in kept)
    assert body["usage"]["truncated_prompt_tokens"] == dropped
    assert body["usage"]["prompt_tokens"] + max_tokens <= 110


def test_a_chat_that_fits_is_not_truncated(service, http):
    body = http.post("/v1/chat/completions", json=conversation(30)).json()  # 73 + 30 words fit in 110
    assert body["usage"]["prompt_tokens"] == 73 and "truncated_prompt_tokens" not in body["usage"]


def test_a_streams_usage_says_how_many_prompt_tokens_were_dropped(service, http):
    body = {**conversation(55), "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        events = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    usage = json.loads(events[-2])["usage"]
    assert usage["truncated_prompt_tokens"] == 23 and usage["prompt_tokens"] == 50


def test_when_even_the_last_turn_does_not_fit_it_is_a_400(service, http):
    response = http.post("/v1/chat/completions", json=conversation(90))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "the prompt has 27 after dropping every turn but the last (73 before) and 90" in error["message"]

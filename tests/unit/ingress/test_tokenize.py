"""/tokenize and /detokenize (`TokenizeService` and its routes) with a fake decoder and a fake
captioner, no Ray: both forms and what reaches the decoder (the chat form rendered from the same
chat messages and tools a chat completion sends; the flags; the default model), images under proxy
vision (each line without its caption, never captioned) and native vision (the decoder counts them),
and hostile or wrong input as OpenAI's errors."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from deployments.config import ServerConfig
from deployments.ingress.api import build_api
from deployments.ingress.guard import GuardSettings
from deployments.ingress.health import HealthService
from deployments.ingress.served_models import ServedModel, ServedModels
from deployments.protocol.openai.models import ModelCard
from tests.conftest import png_bytes
from tests.unit.fake_metrics import FakeMetrics
from tests.unit.ingress.fakes import FakeCaptioner, FakeDecoder, answer_core

KEY = "sk-tokenize-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png_bytes()).decode()}}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def api(
    decoders: dict[str, FakeDecoder], captioner: FakeCaptioner | None = None, max_body_bytes: int = 2**20, **kw: Any
) -> httpx.AsyncClient:
    served = ServedModels(
        [
            ServedModel(
                ModelCard(id=name, created=1),
                answer_core(decoder, captioner, model_name=name, **kw),
                HealthService(decoder, captioner, model_name=name),
            )
            for name, decoder in decoders.items()
        ]
    )
    guard = GuardSettings.from_config(ServerConfig(api_keys=[KEY], api_keys_env=None, max_body_bytes=max_body_bytes))
    app = build_api(served, guard, FakeMetrics())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", headers=AUTH)


async def test_the_completion_form_answers_vllms_shape_with_special_tokens_by_default():
    decoder = FakeDecoder()
    async with api({"echo": decoder}) as http:
        plain = await http.post("/tokenize", json={"model": "echo", "prompt": "abc"})
        strs = await http.post(
            "/tokenize", json={"prompt": "ab", "add_special_tokens": False, "return_token_strs": True}
        )
    assert plain.status_code == 200
    assert plain.json() == {"count": 3, "max_model_len": 2048, "tokens": [97, 98, 99], "token_strs": None}
    assert strs.json()["token_strs"] == ["a", "b"]  # no model: the default one
    first, second = decoder.tokenized
    assert (first.prompt, first.special_tokens, first.messages) == ("abc", True, [])
    assert (second.special_tokens, second.return_token_strs) == (False, True)


async def test_the_chat_form_sends_the_chat_as_a_chat_completion_does_with_its_flags():
    decoder = FakeDecoder()
    chat = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": "It is"},
    ]
    body = {"model": "echo", "messages": chat, "tools": [WEATHER]}
    async with api({"echo": decoder}) as http:
        counted = await http.post("/tokenize", json={**body, "messages": chat[:2]})
        continued = await http.post(
            "/tokenize", json={**body, "add_generation_prompt": False, "continue_final_message": True}
        )
    assert counted.status_code == 200 and counted.json()["count"] == len("Be brief.Weather?")
    assert continued.status_code == 200
    first, second = decoder.tokenized
    assert [(m.role, m.content) for m in first.messages] == [("system", "Be brief."), ("user", "Weather?")]
    assert first.tools is not None and first.tools[0]["function"]["name"] == "get_weather"
    assert (first.special_tokens, first.add_generation_prompt, first.continue_final_message) == (False, True, False)
    assert (second.add_generation_prompt, second.continue_final_message) == (False, True)
    assert "image_tokens" not in counted.json() and "uncaptioned_images" not in counted.json()


async def test_the_model_field_picks_the_decoder_and_an_unknown_one_is_a_404():
    echo, other = FakeDecoder(), FakeDecoder()
    async with api({"echo": echo, "other": other}) as http:
        assert (await http.post("/tokenize", json={"model": "other", "prompt": "x"})).status_code == 200
        assert (await http.post("/detokenize", json={"tokens": [1]})).json() == {"prompt": "<1>"}  # the default
        unknown = await http.post("/tokenize", json={"model": "nope", "prompt": "x"})
    assert len(other.tokenized) == 1 and not echo.tokenized
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


async def test_proxy_vision_counts_each_images_line_without_its_caption_and_never_captions():
    decoder, captioner = FakeDecoder(), FakeCaptioner()
    chat = [{"role": "user", "content": [{"type": "text", "text": "What?"}, IMAGE, IMAGE]}]
    async with api({"echo": decoder}, captioner) as http:
        counted = await http.post("/tokenize", json={"messages": chat})
    async with api({"echo": FakeDecoder()}, None) as http:
        refused = await http.post("/tokenize", json={"messages": chat})
    assert counted.status_code == 200 and counted.json()["uncaptioned_images"] == 2
    assert decoder.tokenized[0].messages[0].content == "What?\nImage 1: \nImage 2: "
    assert not captioner.calls and not decoder.tokenized[0].images
    assert refused.status_code == 400 and "does not accept images" in refused.json()["error"]["message"]


async def test_native_vision_sends_the_images_and_reports_their_tokens():
    decoder = FakeDecoder()
    chat = [{"role": "user", "content": [IMAGE, {"type": "text", "text": "What?"}]}]
    async with api({"echo": decoder}, native_max_images=2) as http:
        counted = await http.post("/tokenize", json={"messages": chat})
        too_many = await http.post("/tokenize", json={"messages": [{"role": "user", "content": [IMAGE] * 3}]})
    assert counted.status_code == 200
    assert counted.json()["image_tokens"] == decoder.image_tokens
    assert counted.json()["count"] == len("What?") + decoder.image_tokens
    assert len(decoder.tokenized[0].images) == 1 and decoder.tokenized[0].messages[0].parts is not None
    assert too_many.status_code == 400


async def test_detokenize_round_trips_and_refuses_ids_outside_the_vocabulary():
    async with api({"echo": FakeDecoder()}) as http:
        ids = (await http.post("/tokenize", json={"prompt": "hi"})).json()["tokens"]
        text = await http.post("/detokenize", json={"tokens": ids})
        empty = await http.post("/detokenize", json={"tokens": []})
        outside = await http.post("/detokenize", json={"tokens": [5, 10**6]})
    assert text.json() == {"prompt": "".join(f"<{t}>" for t in ids)} and empty.json() == {"prompt": ""}
    assert outside.status_code == 400 and outside.json()["error"]["param"] == "tokens"


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/tokenize", {}, "exactly one of prompt"),
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "exactly one of prompt"),
        ("/tokenize", {"prompt": "a", "add_generation_prompt": False}, "only with messages"),
        ("/tokenize", {"prompt": "a", "tools": [WEATHER]}, "only with messages"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"prompt": "a", "chat_template_kwargs": {}}, "chat_template_kwargs"),
        ("/tokenize", {"messages": []}, "messages"),
        ("/tokenize", {"messages": [{"role": "user", "content": "a"}], "continue_final_message": True}, "both"),
        (
            "/tokenize",
            {
                "messages": [{"role": "user", "content": "a"}],
                "add_generation_prompt": False,
                "continue_final_message": True,
            },
            "final assistant message",
        ),
        ("/detokenize", {"tokens": [-1]}, "tokens"),
        ("/detokenize", {"tokens": [True]}, "tokens"),
        ("/detokenize", {"tokens": ["1"]}, "tokens"),
        ("/detokenize", {"tokens": "1 2"}, "tokens"),
        ("/detokenize", {}, "tokens"),
    ],
)
async def test_wrong_input_is_a_400_that_says_what(path, body, words):
    async with api({"echo": FakeDecoder()}) as http:
        answer = await http.post(path, json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and words in error["message"] + str(error["param"])


async def test_the_guard_keys_and_body_cap_cover_both_routes():
    async with api({"echo": FakeDecoder()}, max_body_bytes=1000) as http:
        huge = await http.post("/tokenize", json={"prompt": "x" * 5000})
        many = await http.post("/detokenize", json={"tokens": [1] * 2000})
        anonymous = await http.post("/tokenize", json={"prompt": "x"}, headers={"Authorization": ""})
    assert huge.status_code == 413 and many.status_code == 413
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "invalid_api_key"

"""The chat request logic (`ChatService`) with a fake decoder handle and a fake captioner, no Ray
and no HTTP: deadlines, the degrade/reject policy and what a degraded answer says, SSE framing and
the mapping of errors."""

from __future__ import annotations

import json

import pytest
from ray.exceptions import ActorDiedError
from ray.serve.exceptions import BackPressureError

from deployments.config import ProxyVisionConfig
from deployments.errors import (
    CaptionerTimeout,
    CaptionerUnavailable,
    OverloadedError,
    RequestTimeoutError,
    VisionDisabledError,
    to_openai_error,
)
from deployments.ingress.answer.reply import Reply
from deployments.ingress.apis.chat.service import ChatService
from deployments.ingress.media.unseen import unseen_marker
from deployments.ingress.vision.pipeline import DEGRADED_HEADER
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.chat import ChatCompletionRequest
from deployments.protocol.openai.common import DEGRADED_FINGERPRINT
from tests.conftest import data_url, png_bytes
from tests.unit.ingress.fakes import FakeCaptioner, FakeDecoder, answer_core


def record(request_id: str = "rid") -> RequestRecord:
    return RequestRecord(request_id=request_id)


def service(decoder: FakeDecoder, captioner: FakeCaptioner | None = None, **kw) -> ChatService:
    return ChatService(answer_core(decoder, captioner, **kw))


def chat(content="hi", **fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "echo", "messages": [{"role": "user", "content": content}], **fields}
    )


IMAGE = {"type": "image_url", "image_url": {"url": data_url(png_bytes())}}
NOTICE = "[Image not seen.] "
UNSEEN = {"index": 0, "reason": "captioner_unavailable", "message": "The vision captioner is unavailable: replica died"}


def with_image(text: str = "what is it?") -> list[dict]:
    return [{"type": "text", "text": text}, IMAGE]


async def events(reply: Reply) -> list[str]:
    assert reply.events is not None and reply.body is None
    return [event async for event in reply.events]


def payloads(sse: list[str]) -> list[dict]:
    assert all(e.startswith("data: ") and e.endswith("\n\n") for e in sse)
    assert sse[-1] == "data: [DONE]\n\n"
    return [json.loads(e[len("data: ") :]) for e in sse[:-1]]


async def test_a_completion_in_one_body():
    decoder = FakeDecoder(["Hello", " there"])
    reply = await service(decoder).create(chat("hi", max_completion_tokens=7, stop="x", temperature=0), record("rid-1"))
    assert reply.headers == {} and reply.events is None and reply.body is not None
    assert reply.body["id"] == "chatcmpl-rid-1" and reply.body["model"] == "echo"
    assert reply.body["choices"][0]["message"] == {"role": "assistant", "content": "Hello there"}
    assert reply.body["choices"][0]["finish_reason"] == "stop"
    assert reply.body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    sent = decoder.requests[0]
    assert (sent.max_tokens, sent.stop, sent.temperature) == (7, ["x"], 0)
    assert [(m.role, m.content) for m in sent.messages] == [("user", "hi")]


async def test_stream_events_role_first_one_finish_usage_last_then_done():
    reply = await service(FakeDecoder(["Hello", " there"])).create(
        chat(stream=True, stream_options={"include_usage": True}), record("rid-2")
    )
    chunks = payloads(await events(reply))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "Hello there"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]] == [
        "stop"
    ]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 5
    assert {c["id"] for c in chunks} == {"chatcmpl-rid-2"}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


async def test_the_deadline_before_the_first_chunk_is_a_408_and_cancels_the_generation():
    decoder = FakeDecoder(delay_s=1.0)
    with pytest.raises(RequestTimeoutError) as err:
        await service(decoder, request_timeout_s=0.1).create(chat(), record())
    assert "0.1 s (server.request_timeout_s)" in err.value.message
    assert decoder.streams[0].cancelled
    assert to_openai_error(err.value, record())[0] == 408


async def test_the_deadline_mid_stream_is_an_error_event_then_done():
    decoder = FakeDecoder(["a", "b", "c"], delay_s=0.04)
    reply = await service(decoder, request_timeout_s=0.1).create(chat(stream=True), record())
    chunks = payloads(await events(reply))
    assert chunks[-1]["error"]["code"] == "request_timeout"
    assert decoder.streams[0].cancelled


async def test_a_slow_captioner_counts_against_the_same_deadline():
    decoder = FakeDecoder()
    with pytest.raises(RequestTimeoutError):
        await service(decoder, FakeCaptioner(delay_s=1.0), request_timeout_s=0.1).create(chat(with_image()), record())
    assert decoder.requests == []


async def test_captions_replace_images_in_the_decoders_prompt():
    decoder, captioner = FakeDecoder(), FakeCaptioner()
    notice = ProxyVisionConfig(degraded_notice=NOTICE)
    reply = await service(decoder, captioner, vision=notice).create(chat(with_image("what is it?")), record())
    assert DEGRADED_HEADER not in reply.headers and reply.body is not None
    assert "vision" not in reply.body and "system_fingerprint" not in reply.body  # every image was seen
    assert reply.body["choices"][0]["message"]["content"] == "Hello there"
    assert decoder.requests[0].messages[0].content == "what is it?\nImage 1: a picture for 'what is it?'"
    assert len(captioner.calls) == 1 and captioner.calls[0][0].data == png_bytes()


async def test_a_down_captioner_degrades_visibly_by_default():
    decoder = FakeDecoder()
    reply = await service(decoder, FakeCaptioner(down=True)).create(chat(with_image("see?")), record())
    assert reply.headers == {DEGRADED_HEADER: "captioner-unavailable"}
    prompt = decoder.requests[0].messages[0].content
    assert prompt == f"see?\nImage 1: {unseen_marker('captioner_unavailable')}"
    assert reply.body is not None
    assert reply.body["vision"] == {"degraded": True, "unseen_images": [UNSEEN]}
    assert reply.body["system_fingerprint"] == DEGRADED_FINGERPRINT
    assert reply.body["choices"][0]["message"]["content"] == "Hello there"  # no notice unless configured


async def test_every_unseen_image_is_listed_by_its_position_in_the_request():
    decoder = FakeDecoder()
    messages = [
        {"role": "user", "content": [IMAGE, IMAGE]},
        {"role": "assistant", "content": "two squares"},
        {"role": "user", "content": with_image("and this one?")},
    ]
    request = ChatCompletionRequest.model_validate({"model": "echo", "messages": messages})
    reply = await service(decoder, FakeCaptioner(down=True, error=CaptionerTimeout)).create(request, record())
    assert reply.body is not None
    unseen = reply.body["vision"]["unseen_images"]
    assert [(u["index"], u["reason"]) for u in unseen] == [(i, "captioner_timeout") for i in range(3)]
    assert decoder.requests[0].messages[2].content.endswith(f"Image 3: {unseen_marker('captioner_timeout')}")


async def test_a_degraded_stream_reports_on_its_first_chunk_only():
    reply = await service(FakeDecoder(), FakeCaptioner(down=True)).create(
        chat(with_image(), stream=True, stream_options={"include_usage": True}), record()
    )
    assert reply.headers == {DEGRADED_HEADER: "captioner-unavailable"}
    chunks = payloads(await events(reply))
    assert chunks[0]["vision"] == {"degraded": True, "unseen_images": [UNSEEN]}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert not any("vision" in c for c in chunks[1:])
    assert {c["system_fingerprint"] for c in chunks} == {DEGRADED_FINGERPRINT}  # LangChain reads the last ones


async def test_the_notice_goes_before_the_answer_and_is_not_counted_as_generated():
    vision = ProxyVisionConfig(degraded_notice=NOTICE)
    down = service(FakeDecoder(["Hello", " there"]), FakeCaptioner(down=True), vision=vision)
    body = (await down.create(chat(with_image()), record())).body
    assert body is not None and body["choices"][0]["message"]["content"] == NOTICE + "Hello there"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    chunks = payloads(await events(await down.create(chat(with_image(), stream=True), record())))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": NOTICE}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == NOTICE + "Hello there"
    text = (await down.create(chat("no image here"), record())).body
    assert text is not None and text["choices"][0]["message"]["content"] == "Hello there"
    assert "vision" not in text and "system_fingerprint" not in text


async def test_a_down_captioner_is_a_503_under_the_reject_policy():
    decoder = FakeDecoder()
    strict = ProxyVisionConfig(on_failure="reject", degraded_notice=NOTICE)
    for error in (CaptionerUnavailable, CaptionerTimeout):
        with pytest.raises(CaptionerUnavailable) as err:
            await service(decoder, FakeCaptioner(down=True, error=error), vision=strict).create(
                chat(with_image()), record()
            )
        status, body, headers = to_openai_error(err.value, record())
        assert (status, body["error"]["code"], headers["Retry-After"].isdigit()) == (503, "captioner_unavailable", True)
    assert decoder.requests == []
    text = await service(decoder, FakeCaptioner(down=True), vision=strict).create(chat("x"), record())
    assert text.body is not None  # text requests do not need the captioner


async def test_images_without_a_captioner_are_a_400():
    with pytest.raises(VisionDisabledError) as err:
        await service(FakeDecoder()).create(chat(with_image()), record())
    assert to_openai_error(err.value, record())[0] == 400 and err.value.param == "messages"


async def test_a_full_decoder_queue_before_the_first_byte_keeps_its_status():
    decoder = FakeDecoder(error=BackPressureError(5, 4, retry_after_s=2.5))
    with pytest.raises(OverloadedError) as err:
        await service(decoder).create(chat(stream=True), record())
    status, body, headers = to_openai_error(err.value, record())
    assert (status, body["error"]["code"], headers["Retry-After"]) == (503, "overloaded", "3")


async def test_a_replica_dying_mid_stream_is_an_error_event_then_done():
    decoder = FakeDecoder(["a", "b"], error=ActorDiedError())
    decoder.fail_at = 1
    chunks = payloads(await events(await service(decoder).create(chat(stream=True), record())))
    assert chunks[1]["choices"][0]["delta"]["content"] == "a"
    assert chunks[-1]["error"]["type"] == "service_unavailable"


async def test_a_client_that_goes_away_cancels_the_generation():
    decoder = FakeDecoder(["a", "b", "c"])
    reply = await service(decoder).create(chat(stream=True), record())
    assert reply.events is not None
    first = await anext(reply.events)
    assert '"role": "assistant"' in first
    await reply.events.aclose()  # type: ignore[attr-defined]
    assert decoder.streams[0].cancelled

"""What usage says beyond the counts. A truncated chat (`context_overflow: truncate`):
`usage.truncated_prompt_tokens` in a whole answer and in a stream's usage chunk (absent when nothing
was dropped), the access log's field, and the decoder's pass-through and log line. Prompt tokens
from a prefix cache: `usage.prompt_tokens_details.cached_tokens`, for an engine that has one."""

from __future__ import annotations

import logging

from deployments.config import EngineParams, Lifecycle, ModelConfig
from deployments.ingress.apis.completions.service import CompletionService
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.completions import CompletionRequest
from deployments.protocol.replica import GenerateRequest, TextMessage
from deployments.replicas.decoder import PrimaryDecoder
from tests.unit.ingress.fakes import FakeDecoder, answer_core
from tests.unit.ingress.test_chat import chat, events, payloads, service


async def test_a_whole_answer_says_how_many_prompt_tokens_were_dropped():
    decoder = FakeDecoder(["Hi"])
    decoder.truncated = 40
    record = RequestRecord()
    reply = await service(decoder).create(chat(), record)
    assert reply.body is not None
    assert reply.body["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 1,
        "total_tokens": 4,
        "truncated_prompt_tokens": 40,
    }
    assert record.truncated_prompt_tokens == 40 and record.fields(1.0)["truncated_prompt_tokens"] == 40


async def test_a_streams_usage_chunk_says_it_too_and_n_choices_count_it_once():
    decoder = FakeDecoder(["Hi"])
    decoder.truncated = 40
    reply = await service(decoder).create(
        chat(n=2, stream=True, stream_options={"include_usage": True}), RequestRecord()
    )
    usage = payloads(await events(reply))[-1]["usage"]
    assert usage["truncated_prompt_tokens"] == 40 and usage["prompt_tokens"] == 3


async def test_without_truncation_usage_has_no_such_field():
    record = RequestRecord()
    reply = await service(FakeDecoder()).create(chat(), record)
    assert reply.body is not None and "truncated_prompt_tokens" not in reply.body["usage"]
    assert record.fields(1.0)["truncated_prompt_tokens"] is None


async def test_cached_prompt_tokens_are_the_prompts_details_whole_streamed_and_legacy():
    decoder = FakeDecoder(["Hi"])
    decoder.cached = 2
    whole = await service(decoder).create(chat(n=2), RequestRecord())
    assert whole.body is not None and whole.body["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}
    streamed = await service(decoder).create(chat(stream=True, stream_options={"include_usage": True}), RequestRecord())
    assert payloads(await events(streamed))[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}
    legacy_service = CompletionService(answer_core(decoder))
    legacy = await legacy_service.create(CompletionRequest(model="echo", prompt=["a", "b"]), RequestRecord())
    assert legacy.body is not None and legacy.body["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}


async def test_an_engine_without_a_prefix_cache_sends_no_details():
    reply = await service(FakeDecoder()).create(chat(), RequestRecord())
    assert reply.body is not None and "prompt_tokens_details" not in reply.body["usage"]


async def test_the_decoder_passes_the_figure_on_and_logs_one_line(caplog):
    caplog.set_level(logging.INFO, logger="ray.serve")
    params = EngineParams(max_model_len=30, context_overflow="truncate", max_tokens=5)
    replica = PrimaryDecoder.func_or_class(ModelConfig(name="echo", engine="fake", params=params), Lifecycle())  # type: ignore[attr-defined]
    messages = [TextMessage(role="system", content="be brief")]
    for i in range(3):
        messages += [TextMessage(role="user", content=f"q{i} " * 5), TextMessage(role="assistant", content="a " * 5)]
    messages.append(TextMessage(role="user", content="last one"))
    sent = [c async for c in replica.generate(GenerateRequest(messages=messages, n=2))]
    finals = [c for c in sent if c.finish_reason is not None]
    assert len(finals) == 2 and all(c.truncated_prompt_tokens > 0 for c in finals)
    assert "q0" not in "".join(c.text for c in sent)
    lines = [r.getMessage() for r in caplog.records if "truncated to fit" in r.getMessage()]
    assert lines == [
        f"model echo: chat truncated to fit the context: {finals[0].truncated_prompt_tokens} prompt tokens of "
        f"earlier turns dropped, {finals[0].prompt_tokens} kept"
    ]

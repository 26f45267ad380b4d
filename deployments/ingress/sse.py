"""OpenAI's response shapes for a decoder stream: one `chat.completion`, or server-sent events.

Events are ``data: <chat.completion.chunk>`` lines: the first delta carries the role, exactly one
carries the `finish_reason`, `include_usage` adds a final chunk with no choices and the usage, and
``data: [DONE]`` always ends the stream. An error after the first byte is one ``data: {"error":
...}`` event (the status line has gone out), then ``[DONE]``.

A request answered without some of its images (`Degraded`) says so in the body: the `vision`
field (on the completion, or on a stream's first chunk), `system_fingerprint` (on the completion,
or on every chunk), and the configured notice before the answer's text.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from deployments.errors import to_openai_error
from deployments.ingress.stream import DecoderStream
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol import (
    DEGRADED_FINGERPRINT,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChunkChoice,
    Delta,
    FinishReason,
    GenerateChunk,
    ResponseMessage,
    Usage,
    VisionReport,
)

logger = logging.getLogger("ray.serve")

DONE = "data: [DONE]\n\n"


@dataclass(frozen=True)
class Degraded:
    """What the response of a request answered without some of its images adds: the report of the
    images not seen, and `notice` (`proxy_vision.degraded_notice`), the text put before the answer.
    The notice is not generated: usage counts the decoder's tokens only."""

    report: VisionReport
    notice: str | None = None


def _usage(chunk: GenerateChunk) -> Usage:
    total = chunk.prompt_tokens + chunk.completion_tokens
    return Usage(prompt_tokens=chunk.prompt_tokens, completion_tokens=chunk.completion_tokens, total_tokens=total)


async def completion(
    first: GenerateChunk, stream: DecoderStream, cid: str, model: str, degraded: Degraded | None = None
) -> dict:
    """The whole answer as one `chat.completion` body."""
    text, last = [first.text], first
    while last.finish_reason is None:
        last = await stream.next()
        text.append(last.text)
    if degraded and degraded.notice:
        text.insert(0, degraded.notice)
    choice = Choice(message=ResponseMessage(content="".join(text)), finish_reason=last.finish_reason)
    return ChatCompletion(
        id=cid,
        model=model,
        choices=[choice],
        usage=_usage(last),
        system_fingerprint=DEGRADED_FINGERPRINT if degraded else None,
        vision=degraded.report if degraded else None,
    ).model_dump()


class _Events:
    """Formats the `chat.completion.chunk` events of one completion; the first carries `vision`."""

    def __init__(self, cid: str, model: str, degraded: Degraded | None) -> None:
        self.cid, self.model, self.created = cid, model, int(time.time())
        self.fingerprint = DEGRADED_FINGERPRINT if degraded else None
        self.vision = degraded.report if degraded else None

    def __call__(
        self, delta: Delta, finish: FinishReason | None = None, usage: Usage | None = None, final: bool = False
    ) -> str:
        choices = [] if final else [ChunkChoice(delta=delta, finish_reason=finish)]
        chunk = ChatCompletionChunk(
            id=self.cid,
            created=self.created,
            model=self.model,
            choices=choices,
            usage=usage,
            system_fingerprint=self.fingerprint,
            vision=self.vision,
        )
        self.vision = None
        data = chunk.model_dump()
        for choice in data["choices"]:
            choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
        return f"data: {json.dumps(data)}\n\n"


async def sse_events(
    first: GenerateChunk,
    stream: DecoderStream,
    cid: str,
    model: str,
    degraded: Degraded | None = None,
    *,
    include_usage: bool,
    record: RequestRecord,
) -> AsyncIterator[str]:
    """The answer as server-sent events; a client that goes away cancels the generation."""
    event = _Events(cid, model, degraded)
    chunk, done = first, False
    try:
        yield event(Delta(role="assistant", content=(degraded and degraded.notice) or ""))
        while True:
            if chunk.text:
                yield event(Delta(content=chunk.text))
            if chunk.finish_reason is not None:
                yield event(Delta(), finish=chunk.finish_reason)
                if include_usage:
                    yield event(Delta(), usage=_usage(chunk), final=True)
                break
            chunk = await stream.next()
        done = True
    except Exception as exc:  # after the first byte: one error event, then [DONE]
        status, body, _ = to_openai_error(exc, record.request_id)
        record.error, record.error_status = body["error"]["code"] or body["error"]["type"], status
        if status >= 500:
            logger.exception("stream %s failed", record.request_id, exc_info=exc)
        yield f"data: {json.dumps(body)}\n\n"
        done = True
    finally:
        if not done:  # the client went away: free the decoder slot now
            stream.cancel()
    yield DONE

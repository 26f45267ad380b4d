"""OpenAI's response shapes for a decoder stream: one `chat.completion`, or server-sent events.

Events are ``data: <chat.completion.chunk>`` lines: the first delta carries the role, exactly one
carries the `finish_reason`, `include_usage` adds a final chunk with no choices and the usage, and
``data: [DONE]`` always ends the stream. An error after the first byte is one ``data: {"error":
...}`` event (the status line has gone out), then ``[DONE]``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator

from deployments.errors import to_openai_error
from deployments.ingress.stream import DecoderStream
from deployments.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChunkChoice,
    Delta,
    FinishReason,
    GenerateChunk,
    ResponseMessage,
    Usage,
)

logger = logging.getLogger("ray.serve")

DONE = "data: [DONE]\n\n"


def _usage(chunk: GenerateChunk) -> Usage:
    total = chunk.prompt_tokens + chunk.completion_tokens
    return Usage(prompt_tokens=chunk.prompt_tokens, completion_tokens=chunk.completion_tokens, total_tokens=total)


async def completion(first: GenerateChunk, stream: DecoderStream, cid: str, model: str) -> dict:
    """The whole answer as one `chat.completion` body."""
    text, last = [first.text], first
    while last.finish_reason is None:
        last = await stream.next()
        text.append(last.text)
    choice = Choice(message=ResponseMessage(content="".join(text)), finish_reason=last.finish_reason)
    return ChatCompletion(id=cid, model=model, choices=[choice], usage=_usage(last)).model_dump()


class _Events:
    """Formats the `chat.completion.chunk` events of one completion."""

    def __init__(self, cid: str, model: str) -> None:
        self.cid, self.model, self.created = cid, model, int(time.time())

    def __call__(
        self, delta: Delta, finish: FinishReason | None = None, usage: Usage | None = None, final: bool = False
    ) -> str:
        choices = [] if final else [ChunkChoice(delta=delta, finish_reason=finish)]
        chunk = ChatCompletionChunk(id=self.cid, created=self.created, model=self.model, choices=choices, usage=usage)
        data = chunk.model_dump()
        for choice in data["choices"]:
            choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
        return f"data: {json.dumps(data)}\n\n"


async def sse_events(
    first: GenerateChunk, stream: DecoderStream, cid: str, model: str, *, include_usage: bool, request_id: str
) -> AsyncIterator[str]:
    """The answer as server-sent events; a client that goes away cancels the generation."""
    event = _Events(cid, model)
    chunk, done = first, False
    try:
        yield event(Delta(role="assistant", content=""))
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
        status, body, _ = to_openai_error(exc, request_id)
        if status >= 500:
            logger.exception("stream %s failed", request_id, exc_info=exc)
        yield f"data: {json.dumps(body)}\n\n"
        done = True
    finally:
        if not done:  # the client went away: free the decoder slot now
            stream.cancel()
    yield DONE

"""What a route sends (`Reply`), and the one loop that feeds an answer's chunks to an API's formatter
(which reads each as its semantic events, `events.Answer`) until every choice has finished: `whole`
for one body, `streamed` for a stream of events, framed as the API frames them (`framed`,
with a `Framing`; OpenAI's by default): an error after the first byte is the API's error event(s)
(the status line has gone out as 200; logged with its traceback when it is a bug, `recorded_error`),
a client that goes away cancels the generation at once, and the API's end marker (OpenAI's
``data: [DONE]``; none for APIs whose last event says it) always ends the stream. Once every choice
has finished, a generation that some choice ended early (`tally.Tally.cut_short`) is cancelled.
`sse` and `named_sse` are the two ways an API writes an event.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from deployments.errors import to_openai_error
from deployments.ingress.answer.stream import Generation
from deployments.ingress.answer.tally import Tally
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.common import Usage
from deployments.protocol.replica import GenerateChunk

logger = logging.getLogger("ray.serve")

DONE = "data: [DONE]\n\n"


@dataclass(frozen=True)
class Framing:
    """How an API frames a stream's end: `error` makes the event (or events) of an error after the
    first byte (it records the error on the access log's record), `end` is sent last whatever
    happened.
    """

    error: Callable[[Exception, RequestRecord], str | list[str]]
    end: str | None = DONE


@dataclass
class Reply:
    """What the route sends: a whole body or server-sent events, with extra headers."""

    headers: dict[str, str] = field(default_factory=dict)
    body: dict | None = None
    events: AsyncIterator[str] | None = None

    def response(self) -> Response:
        """The HTTP response that sends it."""
        if self.events is not None:
            return StreamingResponse(self.events, media_type="text/event-stream", headers=self.headers)
        return JSONResponse(self.body, headers=self.headers)


async def whole(generation: Generation, tally: Tally[Any], feed: Callable[[GenerateChunk], object]) -> None:
    """Feed every chunk of the answer to `feed` until each choice has finished."""
    chunk = generation.first
    while True:
        feed(chunk)
        if tally.finished:
            break
        chunk = await generation.next()
    if tally.cut_short:
        generation.cancel()


def streamed(
    generation: Generation,
    tally: Tally[Any],
    feed: Callable[[GenerateChunk], Iterable[str]],
    record: RequestRecord,
    usage: Callable[[Usage], str | Awaitable[str]] | None = None,
    framing: Framing | None = None,
) -> AsyncIterator[str]:
    """The events `feed` makes of each chunk until each choice has finished, then the `usage` event
    of them all when given (`stream_options.include_usage`; an API's last event, which may be
    awaited: the Responses API stores the response before it says it ended).
    """

    async def events() -> AsyncIterator[str]:
        chunk = generation.first
        while True:
            for event in feed(chunk):
                yield event
            if tally.finished:
                if tally.cut_short:
                    generation.cancel()
                if usage is not None:
                    last = usage(tally.usage())
                    yield last if isinstance(last, str) else await last
                return
            chunk = await generation.next()

    return framed(events(), record, generation.cancel, framing)


async def framed(
    events: AsyncIterator[str], record: RequestRecord, cancel: Callable[[], None], framing: Framing | None = None
) -> AsyncIterator[str]:
    """A stream's events as `framing` (OpenAI's by default) frames them: an error after the first byte
    is one error event; a client that goes away `cancel`s the generation at once; the end marker, if
    the API has one, always ends it.
    """
    framing = framing or OPENAI
    done = False
    try:
        async with aclosing(events):  # type: ignore[type-var]
            async for item in events:
                yield item
        done = True
    except Exception as exc:  # after the first byte: the error's event(s), then the end marker
        failed = framing.error(exc, record)
        for item in [failed] if isinstance(failed, str) else failed:
            yield item
        done = True
    finally:
        if not done:  # the client went away: free the decoder slots now
            cancel()
    if framing.end is not None:
        yield framing.end


def recorded_error(exc: Exception, record: RequestRecord) -> tuple[int, dict]:
    """An error after the first byte as `(status, OpenAI body)`; the access log gets the error's own
    code and status, and the service log a bug's traceback.
    """
    status, body, _ = to_openai_error(exc, record.request_id)
    record.error, record.error_status = body["error"]["code"] or body["error"]["type"], status
    if status >= 500:
        logger.exception("stream %s failed", record.request_id, exc_info=exc)
    return status, body


def error_event(exc: Exception, record: RequestRecord) -> str:
    """OpenAI's one event of an error after the first byte."""
    return sse(recorded_error(exc, record)[1])


def sse(data: dict) -> str:
    """One server-sent event of `data` (OpenAI's chat and completions)."""
    return f"data: {json.dumps(data)}\n\n"


def named_sse(data: dict[str, Any]) -> str:
    """One server-sent event named by its data's `type` (the Responses and Anthropic APIs)."""
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n"


OPENAI = Framing(error_event)

"""OpenAI's chat response shapes for a decoder stream: one `chat.completion`, or server-sent events.

Both are built by `ChatChoices` from the same decoder chunks, so a streamed answer and a whole one
say the same thing: each of the `n` choices gets its text (split into content and tool calls by
`tool_calls.ToolCallText`, in the tool-call format the decoder names; calls stream as argument
fragments), its tokens' logprobs when asked for, and its finish reason (`tool_calls` when it called
a tool and no call was cut short). A choice that repeats a tool call ends there (`tool_calls`, the
tokens counted up to that chunk); once every choice has finished, the generation still running
for it is cancelled.

Events are ``data: <chat.completion.chunk>`` lines: each choice's first delta carries the role,
exactly one carries its `finish_reason`, `include_usage` adds a final chunk with no choices and the
usage, and ``data: [DONE]`` always ends the stream. An error after the first byte is one ``data:
{"error": ...}`` event (the status line has gone out), then ``[DONE]``.

A request answered without some of its images (`Degraded`) says so in the body: the `vision`
field (on the completion, or on a stream's first chunk), `system_fingerprint` (on the completion,
or on every chunk), and the configured notice before each choice's text.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field

from deployments.errors import to_openai_error
from deployments.ingress.stream import DecoderStream
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChoiceFinish,
    ChoiceLogprobs,
    ChunkChoice,
    Delta,
    ResponseMessage,
    ToolCallDelta,
)
from deployments.protocol.openai.common import DEGRADED_FINGERPRINT, TokenLogprob, Usage, VisionReport
from deployments.protocol.replica import GenerateChunk
from deployments.tools.calls import Piece, ToolCallText
from deployments.tools.plan import ToolPlan

logger = logging.getLogger("ray.serve")

DONE = "data: [DONE]\n\n"


@dataclass(frozen=True)
class Degraded:
    """What the response of a request answered without some of its images adds: the report of the
    images not seen, and `notice` (`proxy_vision.degraded_notice`), the text put before the answer.
    The notice is not generated: usage counts the decoder's tokens only."""

    report: VisionReport
    notice: str | None = None


@dataclass
class _Choice:
    index: int
    split: ToolCallText
    content: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    unsent_logprobs: list[TokenLogprob] = field(default_factory=list)
    finish: ChoiceFinish | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    truncated_prompt_tokens: int = 0
    cached_prompt_tokens: int | None = None
    started: bool = False
    stopped: bool = False  # ended before its sequence: a repeated tool call


class ChatChoices:
    """The `n` choices of one answer, fed chunk by chunk: `feed` returns the stream's deltas for a
    chunk, `choices` the whole choices once every one has finished."""

    def __init__(self, n: int, tools: ToolPlan, logprobs: bool, notice: str | None = None) -> None:
        self._choices = [_Choice(i, ToolCallText(tools)) for i in range(n)]
        self._logprobs = logprobs
        self._notice = notice

    @property
    def finished(self) -> bool:
        return all(choice.finish is not None for choice in self._choices)

    @property
    def cut_short(self) -> bool:
        """Some choice ended before its sequence did (a repeated tool call): the caller stops the
        generation once every choice has finished."""
        return any(choice.stopped for choice in self._choices)

    def feed(self, chunk: GenerateChunk) -> list[ChunkChoice]:
        choice = self._choices[chunk.index]
        if choice.finish is not None:  # ended early: the rest of its sequence is not the answer's
            return []
        deltas: list[ChunkChoice] = []
        if not choice.started:
            choice.started = True
            deltas.append(ChunkChoice(index=choice.index, delta=Delta(role="assistant", content=self._notice or "")))
            if self._notice:
                choice.content.append(self._notice)
        if chunk.tool_format is not None:
            choice.split.use(chunk.tool_format)
        if chunk.logprobs:
            choice.logprobs += chunk.logprobs
            choice.unsent_logprobs += chunk.logprobs
        deltas += self._deltas(choice, choice.split.feed(chunk.text))
        if choice.split.stopped:
            choice.stopped = True
            finish: ChoiceFinish = "tool_calls"
        elif chunk.finish_reason is None:
            return deltas
        else:
            deltas += self._deltas(choice, choice.split.finish())
            complete = choice.split.calls and choice.split.complete
            finish = "tool_calls" if complete else chunk.finish_reason
        choice.finish = finish
        choice.prompt_tokens, choice.completion_tokens = chunk.prompt_tokens, chunk.completion_tokens
        choice.truncated_prompt_tokens = chunk.truncated_prompt_tokens
        choice.cached_prompt_tokens = chunk.cached_prompt_tokens
        deltas.append(self._delta(choice, Delta(), finish=finish))
        return deltas

    def _deltas(self, choice: _Choice, pieces: list[Piece]) -> list[ChunkChoice]:
        """Content and tool-call pieces in order, a delta per run of each kind."""
        deltas: list[ChunkChoice] = []
        for is_text, run in itertools.groupby(pieces, key=lambda piece: isinstance(piece, str)):
            items = list(run)
            if is_text:
                text = "".join(str(item) for item in items)
                choice.content.append(text)
                deltas.append(self._delta(choice, Delta(content=text)))
            else:
                calls = [item for item in items if isinstance(item, ToolCallDelta)]
                deltas.append(self._delta(choice, Delta(tool_calls=calls)))
        return deltas

    def _delta(self, choice: _Choice, delta: Delta, finish: ChoiceFinish | None = None) -> ChunkChoice:
        logprobs = None
        if self._logprobs and (choice.unsent_logprobs or finish is not None):
            logprobs, choice.unsent_logprobs = ChoiceLogprobs(content=choice.unsent_logprobs), []
        return ChunkChoice(index=choice.index, delta=delta, finish_reason=finish, logprobs=logprobs)

    def choices(self) -> list[Choice]:
        whole = []
        for choice in self._choices:
            assert choice.finish is not None
            content = "".join(choice.content)
            calls = choice.split.calls or None
            whole.append(
                Choice(
                    index=choice.index,
                    message=ResponseMessage(content=content or (None if calls else ""), tool_calls=calls),
                    finish_reason=choice.finish,
                    logprobs=ChoiceLogprobs(content=choice.logprobs) if self._logprobs else None,
                )
            )
        return whole

    def usage(self) -> Usage:
        """The prompt once (the choices share it: the first one's cached tokens), the completions added
        up; `truncated_prompt_tokens` only when the chat was truncated to fit the context."""
        first = self._choices[0]
        completion = sum(choice.completion_tokens for choice in self._choices)
        return Usage.counted(
            first.prompt_tokens, completion, first.truncated_prompt_tokens or None, first.cached_prompt_tokens
        )


async def completion(
    first: GenerateChunk, stream: DecoderStream, cid: str, model: str, choices: ChatChoices, degraded: Degraded | None
) -> dict:
    """The whole answer as one `chat.completion` body."""
    chunk = first
    while True:
        choices.feed(chunk)
        if choices.finished:
            break
        chunk = await stream.next()
    if choices.cut_short:
        stream.cancel()
    return ChatCompletion(
        id=cid,
        model=model,
        choices=choices.choices(),
        usage=choices.usage(),
        system_fingerprint=DEGRADED_FINGERPRINT if degraded else None,
        vision=degraded.report if degraded else None,
    ).model_dump()


class _Events:
    """Formats the `chat.completion.chunk` events of one completion; the first carries `vision`."""

    def __init__(self, cid: str, model: str, degraded: Degraded | None) -> None:
        self.cid, self.model, self.created = cid, model, int(time.time())
        self.fingerprint = DEGRADED_FINGERPRINT if degraded else None
        self.vision = degraded.report if degraded else None

    def __call__(self, choices: list[ChunkChoice], usage: Usage | None = None) -> str:
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


def sse_events(
    first: GenerateChunk,
    stream: DecoderStream,
    cid: str,
    model: str,
    choices: ChatChoices,
    degraded: Degraded | None = None,
    *,
    include_usage: bool,
    record: RequestRecord,
) -> AsyncIterator[str]:
    """The answer as server-sent events; a client that goes away cancels the generation."""
    event = _Events(cid, model, degraded)

    async def events() -> AsyncIterator[str]:
        chunk = first
        while True:
            for delta in choices.feed(chunk):
                yield event([delta])
            if choices.finished:
                if choices.cut_short:
                    stream.cancel()
                if include_usage:
                    yield event([], usage=choices.usage())
                return
            chunk = await stream.next()

    return framed(events(), record, stream.cancel)


async def framed(events: AsyncIterator[str], record: RequestRecord, cancel: Callable[[], None]) -> AsyncIterator[str]:
    """A stream's events as OpenAI frames them, for chat and legacy completions alike: an error after
    the first byte is one error event; a client that goes away `cancel`s the generation at once;
    ``data: [DONE]`` always ends it."""
    done = False
    try:
        async with aclosing(events):  # type: ignore[type-var]
            async for item in events:
                yield item
        done = True
    except Exception as exc:  # after the first byte: one error event, then [DONE]
        yield error_event(exc, record)
        done = True
    finally:
        if not done:  # the client went away: free the decoder slots now
            cancel()
    yield DONE


def error_event(exc: Exception, record: RequestRecord) -> str:
    """The one event of an error after the first byte (the status line has gone out as 200); the
    access log gets the error's own code and status."""
    status, body, _ = to_openai_error(exc, record.request_id)
    record.error, record.error_status = body["error"]["code"] or body["error"]["type"], status
    if status >= 500:
        logger.exception("stream %s failed", record.request_id, exc_info=exc)
    return f"data: {json.dumps(body)}\n\n"

"""The chat completions endpoint's request logic (/v1/chat/completions), apart from its route (as
vLLM keeps `serving_chat` apart from its `api_router`): the request's tools become a plan
(`tools.plan`), its images what the decoder gets (`vision.pipeline`), and the answer core's chunks
OpenAI's chat shapes, one `chat.completion` or server-sent events.

Both are built by `ChatChoices` from the same decoder chunks, so a streamed answer and a whole one
say the same thing: each of the `n` choices gets its text (split into content and tool calls by
`tools.calls.ToolCallText`, in the tool-call format the decoder names; calls stream as argument
fragments), its tokens' logprobs when asked for, and its finish reason (`tool_calls` when it called
a tool and no call was cut short). A choice that repeats a tool call ends there (`tool_calls`, the
tokens counted up to that chunk).

Events are ``data: <chat.completion.chunk>`` lines: each choice's first delta carries the role,
exactly one carries its `finish_reason`, and `include_usage` adds a final chunk with no choices and
the usage. A request answered without some of its images says so in the body: the `vision` field
(on the completion, or on a stream's first chunk), `system_fingerprint` (on the completion, or on
every chunk), and the configured notice before each choice's text.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from deployments.ingress.answer.choices import Tally
from deployments.ingress.answer.core import AnswerCore
from deployments.ingress.answer.reply import Reply, sse, streamed, whole
from deployments.ingress.vision.pipeline import DecoderInput, Degraded
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChoiceFinish,
    ChoiceLogprobs,
    ChunkChoice,
    Delta,
    JsonObjectFormat,
    JsonSchemaResponseFormat,
    NamedToolChoice,
    ResponseMessage,
    ToolCallDelta,
)
from deployments.protocol.openai.common import DEGRADED_FINGERPRINT, TokenLogprob, Usage
from deployments.protocol.replica import GenerateChunk, GenerateRequest, GrammarSpec
from deployments.tools.calls import Piece, ToolCallText
from deployments.tools.plan import ToolPlan, plan_tools


class ChatService:
    def __init__(self, core: AnswerCore) -> None:
        self._core = core

    async def create(self, body: ChatCompletionRequest, record: RequestRecord) -> Reply:
        """`record`: what this request's access-log line and metrics say, filled in as it goes."""
        core = self._core
        plan = tool_plan(body)
        deadline = core.deadline()
        async with deadline.within():
            seen = await core.vision.prepare(body.messages, record)
        request = generate_request(body, seen, plan, core.sampling(body))
        generation = await core.generate([request], deadline, record)
        degraded = seen.degraded
        headers = degraded.headers if degraded else {}
        choices = ChatChoices(body.n, plan, body.logprobs, degraded.notice if degraded else None)
        frames = _Frames(f"chatcmpl-{record.request_id}", core.model, choices, degraded)
        if body.stream:
            usage = frames.usage_chunk if body.include_usage else None
            return Reply(headers, events=streamed(generation, choices.tally, frames.events, record, usage))
        await whole(generation, choices.tally, choices.feed)
        return Reply(headers, body=frames.completion())


def tool_plan(body: ChatCompletionRequest) -> ToolPlan:
    """The plan of the request's `tools`, `tool_choice` and `parallel_tool_calls`."""
    choice = body.tool_choice
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    formatted = body.response_format is not None and body.response_format.type != "text"
    return plan_tools(
        [tool.function for tool in body.tools or []],
        None if isinstance(choice, NamedToolChoice) else choice,
        function=named,
        parallel=body.parallel_tool_calls,
        constrained_by="response_format" if formatted else None,
    )


def response_grammar(body: ChatCompletionRequest, plan: ToolPlan) -> GrammarSpec | None:
    """The grammar of `response_format` (json_object, json_schema), or that of the tool plan."""
    fmt = body.response_format
    if isinstance(fmt, JsonObjectFormat):
        return GrammarSpec(kind="json_object")
    if isinstance(fmt, JsonSchemaResponseFormat):
        return GrammarSpec(kind="json_schema", json_schema=json.dumps(fmt.json_schema.schema_))
    return plan.grammar


def generate_request(
    body: ChatCompletionRequest, seen: DecoderInput, plan: ToolPlan, sampling: dict[str, Any]
) -> GenerateRequest:
    """What the decoder gets: the chat (text only, or with image slots and the images for a native
    VLM), the tools its template renders, and the request's own generation settings (a grammar for
    `response_format` or a forced tool call)."""
    return GenerateRequest(
        messages=seen.messages,
        images=seen.images,
        tools=plan.tools,
        max_tokens=body.completion_limit,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
        grammar=response_grammar(body, plan),
        **sampling,
    )


@dataclass
class _Choice:
    index: int
    split: ToolCallText
    content: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    unsent_logprobs: list[TokenLogprob] = field(default_factory=list)
    started: bool = False


class ChatChoices:
    """The `n` choices of one answer, fed chunk by chunk: `feed` returns the stream's deltas for a
    chunk, `choices` the whole choices once every one has finished (`tally`)."""

    def __init__(self, n: int, tools: ToolPlan, logprobs: bool, notice: str | None = None) -> None:
        self._choices = [_Choice(i, ToolCallText(tools)) for i in range(n)]
        self._logprobs = logprobs
        self._notice = notice
        self.tally: Tally[ChoiceFinish] = Tally(n)

    def feed(self, chunk: GenerateChunk) -> list[ChunkChoice]:
        choice = self._choices[chunk.index]
        if self.tally[chunk.index].finish is not None:  # ended early: the rest of its sequence is not the answer's
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
            finish: ChoiceFinish = "tool_calls"
            self.tally.end(chunk, finish, cut_short=True)
        elif chunk.finish_reason is None:
            return deltas
        else:
            deltas += self._deltas(choice, choice.split.finish())
            complete = choice.split.calls and choice.split.complete
            finish = "tool_calls" if complete else chunk.finish_reason
            self.tally.end(chunk, finish)
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
            finish = self.tally[choice.index].finish
            assert finish is not None
            content = "".join(choice.content)
            calls = choice.split.calls or None
            whole.append(
                Choice(
                    index=choice.index,
                    message=ResponseMessage(content=content or (None if calls else ""), tool_calls=calls),
                    finish_reason=finish,
                    logprobs=ChoiceLogprobs(content=choice.logprobs) if self._logprobs else None,
                )
            )
        return whole


class _Frames:
    """The answer's bodies: the `chat.completion`, or its `chat.completion.chunk` events, the first of
    which carries `vision`."""

    def __init__(self, cid: str, model: str, choices: ChatChoices, degraded: Degraded | None) -> None:
        self.cid, self.model, self.created = cid, model, int(time.time())
        self.choices = choices
        self.fingerprint = DEGRADED_FINGERPRINT if degraded else None
        self.vision = degraded.report if degraded else None

    def completion(self) -> dict:
        return ChatCompletion(
            id=self.cid,
            model=self.model,
            choices=self.choices.choices(),
            usage=self.choices.tally.usage(),
            system_fingerprint=self.fingerprint,
            vision=self.vision,
        ).model_dump()

    def events(self, chunk: GenerateChunk) -> list[str]:
        """A chunk's deltas, an event each."""
        return [self.chunk([delta]) for delta in self.choices.feed(chunk)]

    def usage_chunk(self, usage: Usage) -> str:
        return self.chunk([], usage=usage)

    def chunk(self, choices: list[ChunkChoice], usage: Usage | None = None) -> str:
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
        return sse(data)

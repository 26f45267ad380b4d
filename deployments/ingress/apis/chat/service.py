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

from deployments.ingress.answer.core import AnswerCore, structured_grammar
from deployments.ingress.answer.events import Answer, Began, Call, Logprobs, Text
from deployments.ingress.answer.reply import Reply, sse, streamed, whole
from deployments.ingress.vision.pipeline import Degraded
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
)
from deployments.protocol.openai.common import DEGRADED_FINGERPRINT, TokenLogprob, Usage
from deployments.protocol.replica import GenerateChunk, GrammarSpec
from deployments.tools.plan import ToolPlan, plan_tools


class ChatService:
    """The request logic of /v1/chat/completions for one served model (see the module's docstring)."""

    def __init__(self, core: AnswerCore) -> None:
        self._core = core

    async def create(self, body: ChatCompletionRequest, record: RequestRecord) -> Reply:
        """`record`: what this request's access-log line and metrics say, filled in as it goes."""
        core = self._core
        plan = tool_plan(body)
        opened = await core.open(body.messages, plan, record, **generation_settings(body, plan, core.sampling(body)))
        choices = ChatChoices(Answer(body.n, plan, opened.notice), body.logprobs)
        frames = _Frames(f"chatcmpl-{record.request_id}", core.model, choices, opened.degraded)
        if body.stream:
            usage = frames.usage_chunk if body.include_usage else None
            events = streamed(opened.generation, choices.answer.tally, frames.events, record, usage)
            return Reply(opened.headers, events=events)
        await whole(opened.generation, choices.answer.tally, choices.feed)
        return Reply(opened.headers, body=frames.completion())


def tool_plan(body: ChatCompletionRequest) -> ToolPlan:
    """The plan of the request's `tools`, `tool_choice` and `parallel_tool_calls`."""
    choice = body.tool_choice
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    formatted = body.response_format is not None and body.response_format.type != "text"
    constrained_by = "response_format" if formatted else None
    if body.structured_outputs is not None:
        constrained_by = "structured_outputs"
    return plan_tools(
        [tool.function for tool in body.tools or []],
        None if isinstance(choice, NamedToolChoice) else choice,
        function=named,
        parallel=body.parallel_tool_calls,
        constrained_by=constrained_by,
    )


def response_grammar(body: ChatCompletionRequest, plan: ToolPlan) -> GrammarSpec | None:
    """The grammar of `structured_outputs` or `response_format` (json_object, json_schema), or that of
    the tool plan.
    """
    if body.structured_outputs is not None:
        return structured_grammar(body.structured_outputs)
    fmt = body.response_format
    if isinstance(fmt, JsonObjectFormat):
        return GrammarSpec(kind="json_object")
    if isinstance(fmt, JsonSchemaResponseFormat):
        return GrammarSpec(kind="json_schema", json_schema=json.dumps(fmt.json_schema.schema_))
    return plan.grammar


def generation_settings(body: ChatCompletionRequest, plan: ToolPlan, sampling: dict[str, Any]) -> dict[str, Any]:
    """The request's own generation settings as the decoder takes them: its length, logprobs, the
    grammar of `structured_outputs`, `response_format` or of a forced tool call, the chat's rendering
    (vLLM's `chat_template_kwargs`, `add_generation_prompt`, `continue_final_message`) and its
    sampling.
    """
    return {
        "max_tokens": body.completion_limit,
        "logprobs": (body.top_logprobs or 0) if body.logprobs else None,
        "grammar": response_grammar(body, plan),
        "chat_template_kwargs": body.chat_template_kwargs,
        "add_generation_prompt": body.add_generation_prompt,
        "continue_final_message": body.continue_final_message,
        **sampling,
    }


@dataclass
class _Choice:
    content: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    unsent_logprobs: list[TokenLogprob] = field(default_factory=list)


class ChatChoices:
    """The `n` choices of one answer in chat's shapes, from its semantic events: `feed` returns the
    stream's deltas for a chunk, `choices` the whole choices once every one has finished.
    """

    def __init__(self, answer: Answer, logprobs: bool) -> None:
        self.answer = answer
        self._choices = [_Choice() for _ in range(answer.tally.choices)]
        self._logprobs = logprobs

    def feed(self, chunk: GenerateChunk) -> list[ChunkChoice]:
        """The stream's deltas for a chunk: a delta per run of text or of tool calls, the role's delta
        first and the finish last.
        """
        deltas: list[ChunkChoice] = []
        for _, run in itertools.groupby(self.answer.feed(chunk), key=type):
            items = list(run)
            first = items[0]
            choice = self._choices[first.index]
            if isinstance(first, Began):
                choice.content.append(first.notice or "")
                deltas.append(ChunkChoice(index=first.index, delta=Delta(role="assistant", content=first.notice or "")))
            elif isinstance(first, Logprobs):
                tokens = [token for item in items if isinstance(item, Logprobs) for token in item.tokens]
                choice.logprobs += tokens
                choice.unsent_logprobs += tokens
            elif isinstance(first, Text):
                text = "".join(item.text for item in items if isinstance(item, Text))
                choice.content.append(text)
                deltas.append(self._delta(first.index, Delta(content=text)))
            elif isinstance(first, Call):
                calls = [item.delta for item in items if isinstance(item, Call)]
                deltas.append(self._delta(first.index, Delta(tool_calls=calls)))
            else:
                deltas.append(self._delta(first.index, Delta(), finish=first.finish))
        return deltas

    def _delta(self, index: int, delta: Delta, finish: ChoiceFinish | None = None) -> ChunkChoice:
        choice = self._choices[index]
        logprobs = None
        if self._logprobs and (choice.unsent_logprobs or finish is not None):
            logprobs, choice.unsent_logprobs = ChoiceLogprobs(content=choice.unsent_logprobs), []
        return ChunkChoice(index=index, delta=delta, finish_reason=finish, logprobs=logprobs)

    def choices(self) -> list[Choice]:
        whole = []
        for index, choice in enumerate(self._choices):
            finish = self.answer.tally[index].finish
            assert finish is not None
            content = "".join(choice.content)
            calls = self.answer.calls(index) or None
            whole.append(
                Choice(
                    index=index,
                    message=ResponseMessage(content=content or (None if calls else ""), tool_calls=calls),
                    finish_reason=finish,
                    logprobs=ChoiceLogprobs(content=choice.logprobs) if self._logprobs else None,
                )
            )
        return whole


class _Frames:
    """The answer's bodies: the `chat.completion`, or its `chat.completion.chunk` events, the first of
    which carries `vision`.
    """

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
            usage=self.choices.answer.tally.usage(),
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

"""Anthropic's Messages endpoint's request logic (/v1/messages, /v1/messages/count_tokens), apart
from its routes: the request in chat form (`messages.chat_form`) goes through the same
tool plan and vision pipeline as a chat, and the answer core's chunks become Anthropic's shapes,
one `message` or its stream's events.

Both are built by `MessageBlocks` from the same decoder chunks, so a streamed answer and a whole
one say the same thing: the text (split into text and `tool_use` blocks by `tools.calls.ToolCallText`,
in the tool-call format the decoder names; a call's input streams as `input_json_delta` fragments of
its JSON), and the stop reason: ``tool_use`` when it called a tool and no call was cut short,
``max_tokens``, ``stop_sequence`` (with the one that matched), else ``end_turn``.

Events are ``event: <type>`` / ``data: <json>`` pairs: `message_start` (the message with no content
yet), one `ping`, per block `content_block_start`, its deltas and `content_block_stop`, then
`message_delta` (the stop reason and the usage) and `message_stop`; no end marker follows. An
error after the first byte is one `error` event. Usage follows Anthropic's: `input_tokens` are the
prompt tokens not read from the prefix cache, `cache_read_input_tokens` those that were.

`max_tokens` is what the answer may use at most: when it is more than the model's context leaves
after the prompt (Claude Code asks for 32,000), the answer gets what is left (the stop reason says
``max_tokens`` if it is reached) rather than a 400. A prompt that does not fit at all is Anthropic's
`invalid_request_error` "prompt is too long: N tokens > M maximum" (`errors.as_anthropic`), the
words Claude Code reads to offer compaction.

A request answered without some of its images says so as a chat does: the `X-Vision-Degraded`
header, the `vision` field (on the message, or on `message_start`'s), and the configured notice as
the first text block.
"""

from __future__ import annotations

import json
from typing import Any

from deployments.errors import InvalidRequestError, as_anthropic
from deployments.ingress.answer.core import AnswerCore
from deployments.ingress.answer.events import Answer, Began, Call, Ended, Text
from deployments.ingress.answer.reply import Framing, Reply, named_sse, recorded_error, streamed, whole
from deployments.ingress.apis.messages.chat_form import chat_messages, functions, tool_choice
from deployments.ingress.vision.pipeline import Degraded
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.anthropic import (
    AssistantTurn,
    Message,
    MessagesInput,
    MessagesRequest,
    MessageUsage,
    StopReason,
    SystemTurn,
    TextContent,
    TokenCount,
    ToolUseContent,
)
from deployments.protocol.openai.chat import ChoiceFinish, ToolCallDelta
from deployments.protocol.replica import GenerateChunk, TokenizeInput
from deployments.tools.plan import ToolPlan, plan_tools


class MessagesService:
    """The request logic of Anthropic's /v1/messages for one served model (see the module's docstring)."""

    def __init__(self, core: AnswerCore) -> None:
        self._core = core

    async def create(self, body: MessagesRequest, record: RequestRecord) -> Reply:
        """`record`: what this request's access-log line and metrics say, filled in as it goes."""
        _check_final_turn(body)
        user = (body.metadata or {}).get("user_id")
        if isinstance(user, str) and user and record.session is None:  # Claude Code's names its session
            record.session = f"user:{user[:256]}"
        plan = _plan(body)
        settings: dict[str, Any] = {"temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k}
        settings |= {"grammar": plan.grammar, "stop": body.stop_sequences or []}
        # max_tokens is a ceiling (Claude Code asks 32,000): cut to the context's room by the engine
        opened = await self._core.open(
            chat_messages(body), plan, record, max_tokens=body.max_tokens, max_tokens_ceiling=True, **settings
        )
        blocks = MessageBlocks(f"msg_{record.request_id}", self._core.model, plan, opened.degraded)
        if body.stream:
            events = streamed(opened.generation, blocks.tally, blocks.events, record, framing=ANTHROPIC)
            return Reply(opened.headers, events=events)
        await whole(opened.generation, blocks.tally, blocks.feed)
        return Reply(opened.headers, body=blocks.message().model_dump())

    async def count_tokens(self, body: MessagesInput, record: RequestRecord) -> TokenCount:
        """The prompt's tokens as the decoder counts them: the request rendered by the model's chat
        template, with its tools and its images as the pipeline gives them (captions under proxy
        vision, the model's own image tokens under native vision), by the decoder's tokenizer (no
        generation, no decoder slot; a prompt longer than the context is counted whole).
        """
        _check_final_turn(body)
        plan = _plan(body)
        deadline, seen = await self._core.prepare(chat_messages(body), record)
        counted = await self._core.tokenize(
            TokenizeInput(messages=seen.messages, images=seen.images, tools=plan.tools), deadline
        )
        return TokenCount(input_tokens=counted.count)


def _check_final_turn(body: MessagesInput) -> None:
    turns = [message for message in body.messages if not isinstance(message, SystemTurn)]
    if not turns:
        raise InvalidRequestError(
            "messages: needs a user turn (system turns alone are no conversation).", param="messages"
        )
    if isinstance(turns[-1], AssistantTurn):
        raise InvalidRequestError(
            "messages: a final assistant turn (a prefill for the answer to continue) is not supported; "
            "end with a user turn.",
            param="messages",
        )


def _plan(body: MessagesInput) -> ToolPlan:
    """The tool plan of `tools` and `tool_choice`; a choice that needs tools, or names one that is
    not among them, is a 400 (checked here rather than in the schema, which cannot say it).
    """
    choice, function, parallel = tool_choice(body)
    names = {tool.name for tool in body.tools or []}
    if (choice == "required" or function is not None) and not names:
        raise InvalidRequestError("tool_choice: needs tools", param="tool_choice")
    if function is not None and function not in names:
        raise InvalidRequestError(
            f"tool_choice: names the tool {function!r}, which is not in tools", param="tool_choice"
        )
    return plan_tools(functions(body), choice, function=function, parallel=parallel)


def _error_event(exc: Exception, record: RequestRecord) -> str:
    return named_sse(as_anthropic(*recorded_error(exc, record)))


ANTHROPIC = Framing(_error_event, end=None)


_STOP_REASONS: dict[ChoiceFinish, StopReason] = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}


class MessageBlocks:
    """One answer's content blocks in Anthropic's shapes, from its semantic events (`answer`): `feed`
    returns the stream's events for a chunk (from `message_start` on the first to `message_stop` on
    the last), `message` the whole message once it has finished.
    """

    def __init__(self, mid: str, model: str, plan: ToolPlan, degraded: Degraded | None) -> None:
        self.mid, self.model = mid, model
        self.answer = Answer(1, plan, degraded.notice if degraded else None, call_id_prefix="toolu_")
        self.tally = self.answer.tally
        self._degraded = degraded
        self._stop_reason: StopReason | None = None
        self._content: list[TextContent | ToolUseContent] = []
        self._arguments: list[str] = []  # per block: a tool_use block's input as JSON text so far
        self._open = False  # the last block has not been stopped
        self._stop_sequence: str | None = None

    def events(self, chunk: GenerateChunk) -> list[str]:
        return [named_sse(data) for data in self.feed(chunk)]

    def feed(self, chunk: GenerateChunk) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for event in self.answer.feed(chunk):
            if isinstance(event, Began):
                out += self._start(event)
            elif isinstance(event, Text):
                out += self._text(event.text)
            elif isinstance(event, Call):
                out += self._call(event.delta)
            elif isinstance(event, Ended):
                out += self._end(event)
        return out

    def _start(self, began: Began) -> list[dict[str, Any]]:
        usage = MessageUsage(input_tokens=began.prompt_tokens, output_tokens=0)
        message = Message(id=self.mid, model=self.model, content=[], stop_reason=None, usage=usage)
        degraded = self._degraded
        message.vision = degraded.report if degraded else None
        out: list[dict[str, Any]] = [{"type": "message_start", "message": message.model_dump()}, {"type": "ping"}]
        return out + self._text(began.notice or "")

    def _end(self, ended: Ended) -> list[dict[str, Any]]:
        stop = "stop_sequence" if ended.finish == "stop" and ended.stop_sequence else _STOP_REASONS[ended.finish]
        self._stop_reason = stop
        self._stop_sequence = ended.stop_sequence if stop == "stop_sequence" else None
        usage = self._usage().model_dump()
        delta: dict[str, Any] = {"stop_reason": stop, "stop_sequence": self._stop_sequence}
        return [*self._close(), {"type": "message_delta", "delta": delta, "usage": usage}, {"type": "message_stop"}]

    def _text(self, piece: str) -> list[dict[str, Any]]:
        """Text in the open text block, or a new one."""
        if not piece:
            return []
        out: list[dict[str, Any]] = []
        if not (self._open and isinstance(self._content[-1], TextContent)):
            out += self._begin(TextContent(text=""))
        text = self._content[-1]
        assert isinstance(text, TextContent)
        text.text += piece
        out.append(self._delta({"type": "text_delta", "text": piece}))
        return out

    def _call(self, piece: ToolCallDelta) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if piece.id is not None:  # a new call
            assert piece.function.name is not None
            out += self._begin(ToolUseContent(id=piece.id, name=piece.function.name, input={}))
        fragment = piece.function.arguments
        if fragment:
            self._arguments[-1] += fragment
            out.append(self._delta({"type": "input_json_delta", "partial_json": fragment}))
        return out

    def _begin(self, block: TextContent | ToolUseContent) -> list[dict[str, Any]]:
        out = self._close()
        self._content.append(block)
        self._arguments.append("")
        self._open = True
        return [
            *out,
            {"type": "content_block_start", "index": len(self._content) - 1, "content_block": block.model_dump()},
        ]

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": len(self._content) - 1, "delta": delta}

    def _close(self) -> list[dict[str, Any]]:
        if not self._open:
            return []
        self._open = False
        return [{"type": "content_block_stop", "index": len(self._content) - 1}]

    def _usage(self) -> MessageUsage:
        usage = self.tally.usage()
        cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        return MessageUsage(
            input_tokens=usage.prompt_tokens - cached,
            output_tokens=usage.completion_tokens,
            cache_read_input_tokens=cached,
        )

    def message(self) -> Message:
        content = [
            ToolUseContent(id=block.id, name=block.name, input=_input(arguments))
            if isinstance(block, ToolUseContent)
            else block
            for block, arguments in zip(self._content, self._arguments, strict=True)
        ]
        vision = self._degraded.report if self._degraded else None
        return Message(
            id=self.mid,
            model=self.model,
            content=content,
            stop_reason=self._stop_reason,
            stop_sequence=self._stop_sequence,
            usage=self._usage(),
            vision=vision,
        )


def _input(arguments: str) -> dict[str, Any]:
    """A call's input object from its JSON text; a call cut short at `max_tokens` has what parsed."""
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}

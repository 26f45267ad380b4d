"""Anthropic's Messages endpoint's request logic (/v1/messages, /v1/messages/count_tokens), apart
from its routes: the request in chat form (`protocol.anthropic.chat_form`) goes through the same
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

A request answered without some of its images says so as a chat does: the `X-Vision-Degraded`
header, the `vision` field (on the message, or on `message_start`'s), and the configured notice as
the first text block.
"""

from __future__ import annotations

import json
from typing import Any

from deployments.errors import InvalidRequestError, as_anthropic
from deployments.ingress.answer.choices import Tally
from deployments.ingress.answer.core import AnswerCore, Deadline
from deployments.ingress.answer.reply import Framing, Reply, recorded_error, streamed, whole
from deployments.ingress.answer.stream import Generation
from deployments.ingress.vision.pipeline import DecoderInput, Degraded
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.anthropic.chat_form import chat_messages, functions, tool_choice
from deployments.protocol.anthropic.messages import (
    AssistantTurn,
    Message,
    MessagesInput,
    MessagesRequest,
    MessageUsage,
    StopReason,
    TextContent,
    TokenCount,
    ToolUseContent,
)
from deployments.protocol.openai.chat import ToolCallDelta
from deployments.protocol.replica import GenerateChunk, GenerateRequest, TokenizeInput
from deployments.tools.calls import Piece, ToolCallText
from deployments.tools.plan import ToolPlan, plan_tools


class MessagesService:
    def __init__(self, core: AnswerCore) -> None:
        self._core = core

    async def create(self, body: MessagesRequest, record: RequestRecord) -> Reply:
        """`record`: what this request's access-log line and metrics say, filled in as it goes."""
        settings: dict[str, Any] = {"temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k}
        generation, plan, degraded = await self._generate(
            body, record, max_tokens=body.max_tokens, stop=body.stop_sequences or [], **settings
        )
        blocks = MessageBlocks(f"msg_{record.request_id}", self._core.model, plan, degraded)
        headers = degraded.headers if degraded else {}
        if body.stream:
            return Reply(headers, events=streamed(generation, blocks.tally, blocks.events, record, framing=ANTHROPIC))
        await whole(generation, blocks.tally, blocks.feed)
        return Reply(headers, body=blocks.message().model_dump())

    async def count_tokens(self, body: MessagesInput, record: RequestRecord) -> TokenCount:
        """The prompt's tokens as the decoder counts them: the request rendered by the model's chat
        template, with its tools and its images as the pipeline gives them (captions under proxy
        vision, the model's own image tokens under native vision), by the decoder's tokenizer (no
        generation, no decoder slot; a prompt longer than the context is counted whole)."""
        plan, deadline, seen = await self._prepare(body, record)
        counted = await self._core.tokenize(
            TokenizeInput(messages=seen.messages, images=seen.images, tools=plan.tools), deadline
        )
        return TokenCount(input_tokens=counted.count)

    async def _prepare(self, body: MessagesInput, record: RequestRecord) -> tuple[ToolPlan, Deadline, DecoderInput]:
        """The request's tool plan, its deadline, and its chat in form through the vision pipeline."""
        _check_final_turn(body)
        plan = _plan(body)
        deadline = self._core.deadline()
        async with deadline.within():
            seen = await self._core.vision.prepare(chat_messages(body), record)
        return plan, deadline, seen

    async def _generate(
        self, body: MessagesInput, record: RequestRecord, **settings: Any
    ) -> tuple[Generation, ToolPlan, Degraded | None]:
        """The request in chat form, through the tool plan (its grammar) and the
        vision pipeline, to the decoder with the generation `settings`."""
        plan, deadline, seen = await self._prepare(body, record)
        request = GenerateRequest(
            messages=seen.messages, images=seen.images, tools=plan.tools, grammar=plan.grammar, **settings
        )
        return await self._core.generate([request], deadline, record), plan, seen.degraded


def _check_final_turn(body: MessagesInput) -> None:
    if isinstance(body.messages[-1], AssistantTurn):
        raise InvalidRequestError(
            "messages: a final assistant turn (a prefill for the answer to continue) is not supported; "
            "end with a user turn.",
            param="messages",
        )


def _plan(body: MessagesInput) -> ToolPlan:
    """The tool plan of `tools` and `tool_choice`; a choice that needs tools, or names one that is
    not among them, is a 400 (checked here rather than in the schema, which cannot say it)."""
    choice, function, parallel = tool_choice(body)
    names = {tool.name for tool in body.tools or []}
    if (choice == "required" or function is not None) and not names:
        raise InvalidRequestError("tool_choice: needs tools", param="tool_choice")
    if function is not None and function not in names:
        raise InvalidRequestError(
            f"tool_choice: names the tool {function!r}, which is not in tools", param="tool_choice"
        )
    return plan_tools(functions(body), choice, function=function, parallel=parallel)


def event(data: dict[str, Any]) -> str:
    """One server-sent event named by its data's `type`, as Anthropic sends them."""
    return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n"


def _error_event(exc: Exception, record: RequestRecord) -> str:
    return event(as_anthropic(*recorded_error(exc, record)))


ANTHROPIC = Framing(_error_event, end=None)


class MessageBlocks:
    """One answer's content blocks, fed chunk by chunk: `feed` returns the stream's events for a
    chunk (from `message_start` on the first to `message_stop` on the last), `message` the whole
    message once it has finished (`tally`)."""

    def __init__(self, mid: str, model: str, plan: ToolPlan, degraded: Degraded | None) -> None:
        self.mid, self.model = mid, model
        self.tally: Tally[StopReason] = Tally(1)
        self._split = ToolCallText(plan, id_prefix="toolu_")
        self._degraded = degraded
        self._content: list[TextContent | ToolUseContent] = []
        self._arguments: list[str] = []  # per block: a tool_use block's input as JSON text so far
        self._open = False  # the last block has not been stopped
        self._stop_sequence: str | None = None
        self._started = False

    def events(self, chunk: GenerateChunk) -> list[str]:
        return [event(data) for data in self.feed(chunk)]

    def feed(self, chunk: GenerateChunk) -> list[dict[str, Any]]:
        if self.tally[0].finish is not None:  # ended early: the rest of its sequence is not the answer's
            return []
        out: list[dict[str, Any]] = []
        if not self._started:
            self._started = True
            out += self._start(chunk)
        if chunk.tool_format is not None:
            self._split.use(chunk.tool_format)
        out += self._pieces(self._split.feed(chunk.text))
        if self._split.stopped:
            self.tally.end(chunk, "tool_use", cut_short=True)
        elif chunk.finish_reason is None:
            return out
        else:
            out += self._pieces(self._split.finish())
            self.tally.end(chunk, self._stop_reason(chunk))
            self._stop_sequence = chunk.stop_sequence if self.tally[0].finish == "stop_sequence" else None
        out += self._close()
        usage = self._usage().model_dump()
        delta: dict[str, Any] = {"stop_reason": self.tally[0].finish, "stop_sequence": self._stop_sequence}
        end: list[dict[str, Any]] = [
            {"type": "message_delta", "delta": delta, "usage": usage},
            {"type": "message_stop"},
        ]
        return out + end

    def _start(self, chunk: GenerateChunk) -> list[dict[str, Any]]:
        usage = MessageUsage(input_tokens=chunk.prompt_tokens, output_tokens=0)
        message = Message(id=self.mid, model=self.model, content=[], stop_reason=None, usage=usage)
        degraded = self._degraded
        message.vision = degraded.report if degraded else None
        out: list[dict[str, Any]] = [{"type": "message_start", "message": message.model_dump()}, {"type": "ping"}]
        if degraded and degraded.notice:
            out += self._pieces([degraded.notice])
        return out

    def _stop_reason(self, chunk: GenerateChunk) -> StopReason:
        if self._split.calls and self._split.complete:
            return "tool_use"
        if chunk.finish_reason == "length":
            return "max_tokens"
        return "stop_sequence" if chunk.stop_sequence else "end_turn"

    def _pieces(self, pieces: list[Piece]) -> list[dict[str, Any]]:
        """Text and tool-call pieces as block events: a new block where the kind changes or a call
        begins, the deltas of the open one otherwise."""
        out: list[dict[str, Any]] = []
        for piece in pieces:
            last = self._content[-1] if self._open else None
            if isinstance(piece, str):
                if not piece:
                    continue
                if not isinstance(last, TextContent):
                    out += self._begin(TextContent(text=""))
                text = self._content[-1]
                assert isinstance(text, TextContent)
                text.text += piece
                out.append(self._delta({"type": "text_delta", "text": piece}))
            else:
                out += self._call(piece)
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
            stop_reason=self.tally[0].finish,
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

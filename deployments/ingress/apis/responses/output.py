"""A response's output, built from the answer's semantic events (`ResponseOutput`), and its framing
as the Responses API's events (`ResponseEvents`). A whole response and a streamed one are built by
the same code, so they say the same thing: the streamed events are the steps of building it.

A run of text is a `message` item with one `output_text` part, each tool call a `function_call`
item; text after calls opens a new message. Each event is ``event: <type>`` and ``data: <json>``
with the stream's `sequence_number`: `response.created` and `response.in_progress`, then per item
`output_item.added`, its parts' and deltas' events, `output_item.done`, and last
`response.completed` (or `response.incomplete` when `max_output_tokens` cut it short). An error
after the first event is an `error` event and `response.failed`; no ``[DONE]`` follows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Literal

from deployments.ingress.answer.events import Answer, Began, Call, Ended, Text
from deployments.ingress.answer.reply import named_sse, recorded_error
from deployments.ingress.apis.responses.items import Namespaces
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.chat import ToolCallDelta
from deployments.protocol.openai.common import Usage
from deployments.protocol.openai.items import item_id
from deployments.protocol.openai.response_object import (
    IncompleteDetails,
    InputTokensDetails,
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputTextPart,
    Response,
    ResponseUsage,
)
from deployments.protocol.replica import GenerateChunk

Finish = Literal["completed", "incomplete"]
Event = dict[str, Any]


def socket_frame(data: Event) -> str:
    """An event in WebSocket mode: one text message, the event's JSON."""
    return json.dumps(data)


def response_usage(usage: Usage) -> ResponseUsage:
    """The answer core's usage as the Responses API counts it."""
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    return ResponseUsage(
        input_tokens=usage.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=cached),
        output_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
    )


class ResponseOutput:
    """The output items of one answer, from its semantic events (`answer`): `feed` returns the events
    of a chunk (no sequence numbers yet), `items` holds the items so far; `finish` says how it ended.
    """

    def __init__(self, answer: Answer, namespaces: Namespaces | None = None) -> None:
        """`namespaces`: the request's namespace tools, whose calls name the function and its namespace."""
        self.items: list[OutputItem] = []
        self._namespaces = namespaces
        self.answer = answer
        self.tally = answer.tally
        self.finish: Finish | None = None
        self._open: OutputItem | None = None

    def feed(self, chunk: GenerateChunk) -> list[Event]:
        out: list[Event] = []
        for event in self.answer.feed(chunk):
            if isinstance(event, Began):
                out += self._text(event.notice) if event.notice else []
            elif isinstance(event, Text):
                out += self._text(event.text)
            elif isinstance(event, Call):
                out += self._call(event.delta)
            elif isinstance(event, Ended):
                self.finish = "incomplete" if event.finish == "length" else "completed"
                if not self.items:  # an empty answer is still a message
                    out += self._text("")
                out += self._close()
        return out

    def _add(self, item: OutputItem) -> list[Event]:
        events = self._close()
        self._open = item
        self.items.append(item)
        return [*events, {"type": "response.output_item.added", "output_index": self._index, "item": item.model_dump()}]

    @property
    def _index(self) -> int:
        return len(self.items) - 1

    def _text(self, text: str) -> list[Event]:
        events: list[Event] = []
        item = self._open
        if not isinstance(item, OutputMessage):
            item = OutputMessage(id=item_id("msg"))
            events += self._add(item)
            item.content.append(OutputTextPart())
            events.append(
                {**self._where(item), "type": "response.content_part.added", "part": OutputTextPart().model_dump()}
            )
        if text:
            item.content[0].text += text
            events.append({**self._where(item), "type": "response.output_text.delta", "delta": text, "logprobs": []})
        return events

    def _call(self, delta: ToolCallDelta) -> list[Event]:
        events: list[Event] = []
        item = self._open
        if delta.id is not None or not isinstance(item, OutputFunctionCall):
            name = delta.function.name or ""
            namespace, name = self._namespaces.split(name) if self._namespaces else (None, name)
            item = OutputFunctionCall(
                id=item_id("fc"), call_id=delta.id or item_id("call"), name=name, namespace=namespace
            )
            events += self._add(item)
        if delta.function.arguments:
            item.arguments += delta.function.arguments
            events.append(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item.id,
                    "output_index": self._index,
                    "delta": delta.function.arguments,
                }
            )
        return events

    def _where(self, item: OutputMessage) -> Event:
        return {"item_id": item.id, "output_index": self._index, "content_index": 0}

    def _close(self) -> list[Event]:
        """The events that end the open item, if any."""
        item, self._open = self._open, None
        if item is None:
            return []
        item.status = "incomplete" if self.finish == "incomplete" else "completed"
        events: list[Event] = []
        if isinstance(item, OutputMessage):
            part = item.content[0]
            where = self._where(item)
            events.append({**where, "type": "response.output_text.done", "text": part.text, "logprobs": []})
            events.append({**where, "type": "response.content_part.done", "part": part.model_dump()})
        else:
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item.id,
                    "output_index": self._index,
                    "name": item.name,
                    "arguments": item.arguments,
                }
            )
        return [*events, {"type": "response.output_item.done", "output_index": self._index, "item": item.model_dump()}]

    def response(self, base: Response) -> Response:
        """`base` (the echoed request fields) with this output, its status and its usage."""
        return base.model_copy(
            update={
                "status": self.finish or "in_progress",
                "completed_at": int(time.time()) if self.finish == "completed" else None,
                "incomplete_details": IncompleteDetails(reason="max_output_tokens")
                if self.finish == "incomplete"
                else None,
                "output": list(self.items),
                "usage": response_usage(self.tally.usage()),
            },
            deep=True,
        )


class ResponseEvents:
    """The stream's events for `output`: each with its `sequence_number`, the opening ones before
    the first chunk's, the final one (`end`) with the whole response; `frame` makes each the text
    its transport sends (a server-sent event, or a WebSocket message).
    """

    def __init__(self, base: Response, output: ResponseOutput, frame: Callable[[Event], str] = named_sse) -> None:
        self._base = base
        self._output = output
        self._frame = frame
        self._sequence = 0

    def event(self, data: Event) -> str:
        data["sequence_number"] = self._sequence
        self._sequence += 1
        return self._frame(data)

    def feed(self, chunk: GenerateChunk) -> list[str]:
        opening: list[Event] = []
        if self._sequence == 0:
            snapshot = self._base.model_dump()
            opening = [
                {"type": "response.created", "response": snapshot},
                {"type": "response.in_progress", "response": snapshot},
            ]
        return [self.event(data) for data in opening + self._output.feed(chunk)]

    def end(self, response: Response) -> str:
        return self.event({"type": f"response.{response.status}", "response": response.model_dump()})

    def error(self, exc: Exception, record: RequestRecord) -> list[str]:
        """An error after the first event: an `error` event, then `response.failed`."""
        error = recorded_error(exc, record)[1]["error"]
        failed = self._base.model_copy(
            update={"status": "failed", "error": {"code": error["code"] or error["type"], "message": error["message"]}}
        )
        data = {
            "type": "error",
            "code": error["code"] or error["type"],
            "message": error["message"],
            "param": error["param"],
        }
        return [self.event(data), self.end(failed)]

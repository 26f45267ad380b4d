"""Tools: what the decoder gets for a request's `tools` and `tool_choice`, and the tool calls parsed
back out of the model's text.

The model's chat template renders the tools (the decoder says so with a 400 when it has no tool
support). Its calls come back in the Hermes format that the Qwen2.5 and SmolLM2 templates teach,
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call:

- ``auto`` (the default with tools): text, then any tool calls; `ToolCallText` splits them while the
  text streams, holding back only what could be the start of a block.
- ``required`` and a named function: constrained decoding (vLLM's way), so the output is always a
  valid call: a JSON array of ``{"name", "arguments"}`` (one item unless `parallel_tool_calls`), or
  the named function's arguments as a JSON object.
- ``none``: the tools are not rendered and nothing is parsed.

A block that is not valid JSON, or names no tool of the request, stays in the content as text.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from deployments.errors import InvalidRequestError
from deployments.protocol.payloads import GrammarSpec
from deployments.protocol.requests import (
    ChatCompletionRequest,
    JsonObjectFormat,
    JsonSchemaResponseFormat,
    NamedToolChoice,
)
from deployments.protocol.responses import ToolCall, ToolCallFunction

OPEN, CLOSE = "<tool_call>", "</tool_call>"

Mode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class ToolPlan:
    """How one request uses tools: what the template renders, the grammar, and how output is read."""

    mode: Mode = "none"
    tools: list[dict[str, Any]] | None = None  # for the chat template
    names: frozenset[str] = frozenset()
    function: str | None = None  # the named function
    grammar: GrammarSpec | None = None


def plan_tools(body: ChatCompletionRequest) -> ToolPlan:
    choice = body.tool_choice or ("auto" if body.tools else "none")
    if not body.tools or choice == "none":
        return ToolPlan()
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools]
    names = frozenset(tool.function.name for tool in body.tools)
    if choice == "auto":
        return ToolPlan("auto", tools, names)
    if body.response_format is not None and body.response_format.type != "text":
        raise InvalidRequestError(
            "response_format cannot be combined with tool_choice 'required' or a named function: "
            "both constrain the output.",
            param="response_format",
        )
    if isinstance(choice, NamedToolChoice):
        function = next(t.function for t in body.tools if t.function.name == choice.function.name)
        schema = json.dumps(function.parameters)
        return ToolPlan("named", tools, names, function.name, GrammarSpec(kind="json_schema", json_schema=schema))
    calls = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.function.name}, "arguments": t.function.parameters},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in body.tools
        ]
    }
    array: dict[str, Any] = {"type": "array", "items": calls, "minItems": 1}
    if not body.parallel_tool_calls:
        array["maxItems"] = 1
    return ToolPlan("required", tools, names, grammar=GrammarSpec(kind="json_schema", json_schema=json.dumps(array)))


def response_grammar(body: ChatCompletionRequest, plan: ToolPlan) -> GrammarSpec | None:
    """The grammar of `response_format` (json_object, json_schema), or that of the tool plan."""
    fmt = body.response_format
    if isinstance(fmt, JsonObjectFormat):
        return GrammarSpec(kind="json_object")
    if isinstance(fmt, JsonSchemaResponseFormat):
        return GrammarSpec(kind="json_schema", json_schema=json.dumps(fmt.json_schema.schema_))
    return plan.grammar


def call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def _call(name: str, arguments: Any) -> ToolCall:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(id=call_id(), function=ToolCallFunction(name=name, arguments=text))


@dataclass
class ToolCallText:
    """One choice's text, split into content and tool calls as it streams. `feed` returns the
    content that can be sent now; `finish` returns what is left of it and the calls."""

    plan: ToolPlan
    _held: str = ""  # text that may still turn out to be the start of a block (or trailing space)
    _blocks: str = ""  # from the first block on
    _started: bool = False  # some content has been sent (leading whitespace is dropped)
    calls: list[ToolCall] = field(default_factory=list)

    def feed(self, text: str) -> str:
        if self.plan.mode == "none":
            return text
        if self.plan.mode != "auto":
            self._blocks += text  # the whole output is the call(s)
            return ""
        if self._blocks:
            self._blocks += text
            return ""
        held = self._held + text
        if (at := held.find(OPEN)) >= 0:  # content ends here: what follows is read at the end
            self._held, self._blocks = "", held[at:]
            return self._content(held[:at])
        keep = _partial_open(held)
        return self._content(held[: len(held) - keep], keep=held[len(held) - keep :])

    def _content(self, ready: str, keep: str = "") -> str:
        """Send `ready` but its trailing whitespace (dropped if a call follows) and leading whitespace."""
        body = ready.rstrip()
        self._held = ready[len(body) :] + keep
        if not self._started:
            body = body.lstrip()
            self._started = bool(body)
        return body

    def finish(self) -> tuple[str, list[ToolCall]]:
        """`(content still to send, tool calls)`."""
        if self.plan.mode == "none":
            return "", []
        if self.plan.mode == "named" and self.plan.function is not None:
            self.calls = [_call(self.plan.function, self._blocks.strip())]
            return "", self.calls
        if self.plan.mode == "required":
            self.calls = _required_calls(self._blocks)
            return ("" if self.calls else self._blocks), self.calls
        rest, self.calls = _parse_blocks(self._blocks, self.plan.names)
        if self.calls:  # text after the calls (rare) joins the content with one space
            return (" " + rest if self._started and rest else rest), self.calls
        tail = self._held + rest
        return tail if self._started else tail.lstrip(), self.calls


def _partial_open(text: str) -> int:
    """Length of the longest end of `text` that is a proper prefix of the opening tag."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-n:]):
            return n
    return 0


def _parse_blocks(text: str, names: frozenset[str]) -> tuple[str, list[ToolCall]]:
    """Tool calls of the ``<tool_call>`` blocks in `text`, and the text they leave."""
    calls: list[ToolCall] = []
    rest: list[str] = []
    while (start := text.find(OPEN)) >= 0:
        end = text.find(CLOSE, start)
        inner = text[start + len(OPEN) : end if end >= 0 else len(text)]
        call = _block_call(inner, names)
        if call is None:
            rest.append(text[: end + len(CLOSE) if end >= 0 else len(text)])
        else:
            rest.append(text[:start])
            calls.append(call)
        text = text[end + len(CLOSE) :] if end >= 0 else ""
    rest.append(text)
    return "".join(rest).strip() if calls else "".join(rest), calls


def _block_call(inner: str, names: frozenset[str]) -> ToolCall | None:
    try:
        data = json.loads(inner)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("name") not in names:
        return None
    return _call(data["name"], data.get("arguments", data.get("parameters", {})))


def _required_calls(text: str) -> list[ToolCall]:
    """The calls of a constrained array; none when it was cut short (max_tokens): then it is content."""
    try:
        items = json.loads(text)
    except ValueError:
        return []
    items = items if isinstance(items, list) else [items]
    return [_call(item["name"], item.get("arguments", {})) for item in items if isinstance(item, dict)]

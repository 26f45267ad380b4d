"""Tools: what the decoder gets for a request's `tools` and `tool_choice`, and the tool calls parsed
back out of the model's text.

The decoder renders the tools in the model's tool-call format (its template's own, or the generic
format's prompt for a template without tools) and names that format on the request's first chunk;
`ToolCallText` reads the calls with that format's parser (`tool_formats`; Hermes until told):

- ``auto`` (the default with tools): text, then any tool calls; `ToolCallText` splits them while the
  text streams, holding back only what could be the start of a call (a marker such as
  ``<tool_call>``, or the whole answer while it may be a JSON or pythonic call).
- ``required`` and a named function: constrained decoding (vLLM's way), so the output is always a
  valid call: a JSON list of ``{"name", "arguments"}`` (one item unless `parallel_tool_calls`; the
  named function's only), which is also the generic format's call, with at most a space between
  its tokens (`GrammarSpec.compact`) and no arguments the tool does not declare (`closed`).
- ``none``: the tools are not rendered and nothing is parsed.

Text that is not a valid call (not the format's syntax, or no tool of the request) stays content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from deployments.errors import InvalidRequestError
from deployments.ingress.tool_formats import FORMATS, ToolFormat, required_calls
from deployments.protocol.payloads import GrammarSpec
from deployments.protocol.requests import (
    ChatCompletionRequest,
    JsonObjectFormat,
    JsonSchemaResponseFormat,
    NamedToolChoice,
)
from deployments.protocol.responses import ToolCall

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
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    functions = [t.function for t in body.tools if named is None or t.function.name == named]
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": f.name}, "arguments": closed(f.parameters)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in functions
    ]
    array: dict[str, Any] = {"type": "array", "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    array |= {"minItems": 1, "maxItems": 1} if named or not body.parallel_tool_calls else {"minItems": 1}
    grammar = GrammarSpec(kind="json_schema", json_schema=json.dumps(array), compact=True)
    return ToolPlan("named" if named else "required", tools, names, named, grammar)


def closed(schema: Any) -> Any:
    """A tool's parameters with every object that lists its properties and says nothing of others
    closed to them (`additionalProperties: false`), as llama.cpp's grammars read a schema: in a
    constrained call, undeclared arguments would only be room for a weak model to ramble in."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: closed(value) for key, value in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def response_grammar(body: ChatCompletionRequest, plan: ToolPlan) -> GrammarSpec | None:
    """The grammar of `response_format` (json_object, json_schema), or that of the tool plan."""
    fmt = body.response_format
    if isinstance(fmt, JsonObjectFormat):
        return GrammarSpec(kind="json_object")
    if isinstance(fmt, JsonSchemaResponseFormat):
        return GrammarSpec(kind="json_schema", json_schema=json.dumps(fmt.json_schema.schema_))
    return plan.grammar


@dataclass
class ToolCallText:
    """One choice's text, split into content and tool calls as it streams. `use` names the model's
    format (before the first `feed`); `feed` returns the content that can be sent now; `finish`
    returns what is left of it and the calls."""

    plan: ToolPlan
    format: ToolFormat = FORMATS["hermes"]
    _held: str = ""  # text that may still turn out to be the start of a call (or trailing space)
    _calls_text: str | None = None  # from where the calls start on
    _leading: bool = True  # only whitespace so far: a lead ("{", "[") may still open a call
    _started: bool = False  # some content has been sent (leading whitespace is dropped)
    calls: list[ToolCall] = field(default_factory=list)

    def use(self, name: str | None) -> None:
        if name in FORMATS:
            self.format = FORMATS[name]

    def feed(self, text: str) -> str:
        if self.plan.mode == "none":
            return text
        if self.plan.mode != "auto" or self._calls_text is not None:  # the rest is the call(s)
            self._calls_text = (self._calls_text or "") + text
            return ""
        held = self._held + text
        if self._leading:
            body, leads = held.lstrip(), self.format.leads
            if not body or any(lead.startswith(body) for lead in leads):  # not decided yet
                self._held = held
                return ""
            if any(body.startswith(lead) for lead in leads):
                self._held, self._calls_text = "", body
                return ""
            self._leading = False
        found = [at for marker in self.format.markers if (at := held.find(marker)) >= 0]
        if found:  # content ends here: what follows is read at the end
            at = min(found)
            self._held, self._calls_text = "", held[at:]
            return self._content(held[:at])
        keep = _partial_marker(held, self.format.markers)
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
        text = self._calls_text or ""
        if self.plan.mode != "auto":
            self.calls = required_calls(text)
            return ("" if self.calls else text), self.calls
        parsed = self.format.parse(text, self.plan.names) if text else None
        if parsed is not None:  # text after the calls (rare) joins the content with one space
            rest, self.calls = parsed
            return (" " + rest if self._started and rest else rest), self.calls
        tail = self._held + text
        return tail if self._started else tail.lstrip(), []


def _partial_marker(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that is a proper prefix of a marker."""
    for n in range(min(max((len(m) for m in markers), default=1) - 1, len(text)), 0, -1):
        if any(marker.startswith(text[-n:]) for marker in markers):
            return n
    return 0

"""Tools: what the decoder gets for a request's `tools` and `tool_choice` (`ToolPlan`), and the
grammar of a forced call or of `response_format`.

The decoder renders the tools in the model's tool-call format (its template's own, or the generic
format's prompt for a template without tools) and names that format on the request's first chunk;
`tool_calls.ToolCallText` reads the calls in that format (`tool_formats`; Hermes until told):

- ``auto`` (the default with tools): text, then any tool calls, split while the text streams.
- ``required`` and a named function: constrained decoding (vLLM's way), so the output is always a
  valid call: a JSON list of ``{"name", "arguments"}`` (one item unless `parallel_tool_calls`; the
  named function's only), which is also the generic format's call, with at most a space between
  its tokens (`GrammarSpec.compact`) and no arguments the tool does not declare (`closed`).
- ``none``: the tools are not rendered and nothing is parsed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from deployments.errors import InvalidRequestError
from deployments.protocol.openai.chat import (
    ChatCompletionRequest,
    JsonObjectFormat,
    JsonSchemaResponseFormat,
    NamedToolChoice,
)
from deployments.protocol.replica import GrammarSpec

Mode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class ToolPlan:
    """How one request uses tools: what the template renders, the grammar, and how output is read."""

    mode: Mode = "none"
    tools: list[dict[str, Any]] | None = None  # for the chat template
    names: frozenset[str] = frozenset()
    function: str | None = None  # the named function
    grammar: GrammarSpec | None = None
    parallel: bool = True  # `parallel_tool_calls`: more than one call per answer


def plan_tools(body: ChatCompletionRequest) -> ToolPlan:
    choice = body.tool_choice or ("auto" if body.tools else "none")
    if not body.tools or choice == "none":
        return ToolPlan()
    tools = [tool.model_dump(exclude_none=True) for tool in body.tools]
    names = frozenset(tool.function.name for tool in body.tools)
    parallel = body.parallel_tool_calls
    if choice == "auto":
        return ToolPlan("auto", tools, names, parallel=parallel)
    if body.response_format is not None and body.response_format.type != "text":
        raise InvalidRequestError(
            "response_format cannot be combined with tool_choice 'required' or a named function: "
            "both constrain the output.",
            param="response_format",
        )
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    parallel = parallel and named is None
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
    array |= {"minItems": 1} if parallel else {"minItems": 1, "maxItems": 1}
    grammar = GrammarSpec(kind="json_schema", json_schema=json.dumps(array), compact=True)
    return ToolPlan("named" if named else "required", tools, names, named, grammar, parallel)


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

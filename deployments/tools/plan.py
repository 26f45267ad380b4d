"""The plan of a request's tools: what the decoder gets for its function tools and its tool choice
(`ToolPlan`, from any API family's request), and the grammar of a forced call.

The decoder renders the tools in the model's tool-call format (its template's own, or the generic
format's prompt for a template without tools) and names that format on the request's first chunk;
`calls.ToolCallText` reads the calls in that format (`formats`; Hermes until told):

- ``auto`` (the default with tools): text, then any tool calls, split while the text streams.
- ``required`` and a named function: constrained decoding (vLLM's way), so the output is always a
  valid call: a JSON list of ``{"name", "arguments"}`` (one item unless `parallel_tool_calls`; the
  named function's only), which is also the generic format's call, with at most a space between
  its tokens (`GrammarSpec.compact`) and no arguments the tool does not declare (`closed`).
- ``none``: the tools are not rendered and nothing is parsed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from deployments.errors import InvalidRequestError
from deployments.protocol.openai.common import FunctionDefinition
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


ToolChoiceMode = Literal["none", "auto", "required"]


def plan_tools(
    functions: Sequence[FunctionDefinition],
    choice: ToolChoiceMode | None = None,
    *,
    function: str | None = None,
    parallel: bool = True,
    constrained_by: str | None = None,
) -> ToolPlan:
    """The plan of a request's function tools, whatever API family they came in: `choice` (None:
    ``auto`` with tools), or `function`, the one a request names; `parallel`: `parallel_tool_calls`;
    `constrained_by`: the request's field that already constrains the output (``response_format``),
    a 400 with ``required`` or a named function.
    """
    choice = "auto" if choice is None and function is None else choice
    if not functions or choice == "none":
        return ToolPlan()
    tools = [{"type": "function", "function": f.model_dump(exclude_none=True)} for f in functions]
    names = frozenset(f.name for f in functions)
    if choice == "auto":
        return ToolPlan("auto", tools, names, parallel=parallel)
    if constrained_by is not None:
        raise InvalidRequestError(
            f"{constrained_by} cannot be combined with tool_choice 'required' or a named function: "
            "both constrain the output.",
            param=constrained_by,
        )
    parallel = parallel and function is None
    called = [f for f in functions if function is None or f.name == function]
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": f.name}, "arguments": closed(f.parameters)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in called
    ]
    array: dict[str, Any] = {"type": "array", "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    array |= {"minItems": 1} if parallel else {"minItems": 1, "maxItems": 1}
    grammar = GrammarSpec(kind="json_schema", json_schema=json.dumps(array), compact=True)
    return ToolPlan("named" if function else "required", tools, names, function, grammar, parallel)


def closed(schema: Any) -> Any:
    """A tool's parameters with every object that lists its properties and says nothing of others
    closed to them (`additionalProperties: false`), as llama.cpp's grammars read a schema: in a
    constrained call, undeclared arguments would only be room for a weak model to ramble in.
    """
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: closed(value) for key, value in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out

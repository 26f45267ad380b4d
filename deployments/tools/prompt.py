"""The tools' prompt, for every engine library: which format a model's tools take
(`resolve_tool_format`, from its template), and the generic format (`capabilities.tool_call_format:
generic`) for a chat template that does not render tools. As llama.cpp's server does, the tool
definitions and the call format go into the system message (a system message is added when the
chat has none; where the template has no system role, they open the first user message).

The tools, and the chat's earlier calls and tool results, are written as plain text that any
template renders:

- the tools: one JSON line per function (name, description, parameters), then the instruction: to
  call tools, answer with only a JSON list ``[{"name": ..., "arguments": {...}}]``, else in plain text;
- an assistant's earlier calls: that same JSON list, after its text;
- `tool` messages: one user message per run of them, ``Tool results:`` then a line per result
  (``name (call id): content``).

`required` and a named function are constrained to that same JSON list (`plan`'s grammar), so the
model is forced into the format its prompt teaches. Messages are in the chat-template convention
(`template_message`): an assistant's `tool_calls` with arguments as objects, a tool message's
`tool_call_id`.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from deployments.config import ToolCallFormat
from deployments.errors import ConfigError
from deployments.protocol.replica import TextMessage

logger = logging.getLogger("ray.serve")
_PYTHONIC_EXAMPLE = re.compile(r"\[\s*func_name\w*\(")

RESULTS = "Tool results:"


def template_message(message: TextMessage) -> dict[str, Any]:
    """A message in transformers' chat-template convention: an assistant's `tool_calls` as
    `{"type": "function", "function": {"name", "arguments": <dict>}}` (templates render the
    arguments with `tojson` or iterate them), a tool answer with its `tool_call_id`.
    """
    rendered: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        rendered["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    return rendered


def _arguments(text: str) -> Any:
    """OpenAI's arguments (JSON text) as the object templates expect; text that is no JSON object stays text."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, dict) else text


def tool_prompt(tools: list[dict[str, Any]]) -> str:
    """The system message's tool section: the definitions and how to call them."""
    functions = [tool.get("function", tool) for tool in tools]
    lines = ["You can call these tools (functions; their parameters are JSON Schema):"]
    for function in functions:
        entry = {key: function[key] for key in ("name", "description", "parameters") if key in function}
        lines.append(json.dumps(entry, ensure_ascii=False))
    lines += [
        "",
        "To call tools, answer with only a JSON list of calls, and nothing else, for example:",
        json.dumps([{"name": functions[0].get("name", "name"), "arguments": _example(functions[0])}]),
        f'The results come back in a message that starts with "{RESULTS}". When no tool is needed, or once '
        "you have the results you need, answer in plain text.",
    ]
    return "\n".join(lines)


def _example(function: dict[str, Any]) -> dict[str, Any]:
    """Arguments of the example call: the function's required parameters with placeholder values."""
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    names = parameters.get("required") or list(properties)[:1]
    placeholders = {"integer": 0, "number": 0, "boolean": True, "array": [], "object": {}}
    return {
        name: placeholders.get(str((properties.get(name) or {}).get("type")), "...")
        for name in names
        if isinstance(name, str)
    }


def calls_text(calls: list[dict[str, Any]]) -> str:
    """An assistant's calls (chat-template convention) as the generic format writes them."""
    written = []
    for call in calls:
        function = call.get("function", call)
        written.append({"name": function.get("name"), "arguments": function.get("arguments", {})})
    return json.dumps(written, ensure_ascii=False)


def generic_chat(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, system_role: bool = True
) -> list[dict[str, Any]]:
    """`messages` with tool calls and results as text and, when `tools` are given, the tool prompt
    in the system message (`system_role`: the template renders one), ready for any template.
    """
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # call id -> function name, for the results
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            calls = message["tool_calls"]
            names.update({str(c.get("id")): str(c.get("function", {}).get("name")) for c in calls})
            text = _text(message.get("content"))
            out.append({"role": "assistant", "content": (text + "\n" if text else "") + calls_text(calls)})
        elif role == "tool":
            call_id = message.get("tool_call_id")
            line = f"{names.get(str(call_id), 'tool')} ({call_id}): {_text(message.get('content'))}"
            if out and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + line
            else:
                out.append({"role": "user", "content": f"{RESULTS}\n{line}", "tool_results": True})
        else:
            out.append(dict(message))
    for message in out:
        message.pop("tool_results", None)
    if tools:
        out = _with_prompt(out, tool_prompt(tools), system_role)
    return out


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):  # parts: their text
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


def _with_prompt(messages: list[dict[str, Any]], prompt: str, system_role: bool) -> list[dict[str, Any]]:
    """The prompt before the system message's text (one is added when there is none), or, for a
    template without a system role, before the first user message's text.
    """
    role = "system" if system_role else "user"
    at = next((i for i, m in enumerate(messages) if m.get("role") == role), None)
    if at is None or (role == "system" and at != 0):
        return [{"role": role, "content": prompt}, *messages]
    message = dict(messages[at])
    content = message.get("content")
    if isinstance(content, list):
        message["content"] = [{"type": "text", "text": prompt + "\n\n"}, *content]
    else:
        message["content"] = prompt + ("\n\n" + content if content else "")
    return [*messages[:at], message, *messages[at + 1 :]]


def detect_tool_format(template: str) -> ToolCallFormat | None:
    """The tool-call family a template teaches, from the strings it contains; None when unclear."""
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_start|>" in template or _PYTHONIC_EXAMPLE.search(template):
        return "pythonic"
    if "<|python_tag|>" in template:
        return "llama3_json"
    return None


def resolve_tool_format(configured: str, renders: bool, template: str, model: str) -> ToolCallFormat:
    """The format a model's tools take, from `capabilities.tool_call_format` and its chat template
    (`renders`: the template renders a tool list; `template`: its text): under `auto`, the family
    whose call syntax the template contains, else generic. A named family whose template does not
    render tools is a `ConfigError`.
    """
    if configured == "auto":
        found = detect_tool_format(template) if renders else None
        if renders and found is None:
            logger.warning(
                "model %s: its chat template renders tools in a syntax not recognized; using the generic tool "
                "format (set capabilities.tool_call_format to choose)",
                model,
            )
        return found or "generic"
    if configured != "generic" and not renders:
        raise ConfigError(
            f"model {model!r}: capabilities.tool_call_format is {configured}, but its chat template does not "
            "render tools: set chat_template to a template that does, or tool_call_format to auto or generic"
        )
    return configured  # type: ignore[return-value]

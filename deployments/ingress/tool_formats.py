"""Tool calls in a model's text, one parser per tool-call format (`capabilities.tool_call_format`,
which the decoder names on a request's first chunk; the formats: `deployments.config.chat`).

A `ToolFormat` says where calls may start: at a `marker` anywhere in the text (a token such as
``<tool_call>`` or ``[TOOL_CALLS]``: the text before it is content), or at a `lead` that opens the
answer (``{``, ``[``: a JSON or pythonic call is the whole answer, as vLLM's llama3_json and
pythonic parsers read it). Its `parse` reads the text from there to the end: the calls and the text
they leave, or None when it holds no valid call, and then it all stays content. A call is valid when
it names one of the request's tools and its arguments are a JSON object. `tools.ToolCallText` feeds
the text as it streams.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from deployments.config import TOOL_MARKERS, ToolCallFormat
from deployments.protocol.responses import ToolCall, ToolCallFunction

Parsed = tuple[str, list[ToolCall]]  # the text left, the calls
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_CALLS, MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"
PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
_MISTRAL_NAMED = re.compile(r"([A-Za-z_][\w.\-]*)\s*(?:\[CALL_ID\]\s*\S+?\s*)?\[ARGS\]")
_FENCE = re.compile(r"^```[A-Za-z]*[ \t]*\n?")
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ToolFormat:
    name: ToolCallFormat
    markers: tuple[str, ...]  # open calls anywhere
    leads: tuple[str, ...]  # open calls at the start of the answer only
    parse: Callable[[str, frozenset[str]], Parsed | None]


def call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


def make_call(name: str, arguments: Any) -> ToolCall:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(id=call_id(), function=ToolCallFunction(name=name, arguments=text))


def as_call(item: Any, names: frozenset[str]) -> ToolCall | None:
    """`{"name": ..., "arguments" (or "parameters"): {...}}` naming one of `names`, as a call."""
    if not isinstance(item, dict) or item.get("name") not in names:
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    return make_call(item["name"], arguments) if isinstance(arguments, dict) else None


def _all_calls(items: list[Any], names: frozenset[str]) -> list[ToolCall] | None:
    calls = [as_call(item, names) for item in items]
    return [c for c in calls if c is not None] if calls and None not in calls else None


def _json_prefix(text: str) -> tuple[Any, str] | None:
    """The JSON value that opens `text` (after whitespace) and the text after it."""
    text = text.lstrip()
    try:
        value, end = _DECODER.raw_decode(text)
    except ValueError:
        return None
    return value, text[end:]


def parse_hermes(text: str, names: frozenset[str]) -> Parsed | None:
    """``<tool_call>{json}</tool_call>`` blocks; a block that is no valid call stays in the text."""
    calls: list[ToolCall] = []
    rest: list[str] = []
    while (start := text.find(HERMES_OPEN)) >= 0:
        end = text.find(HERMES_CLOSE, start)
        inner = text[start + len(HERMES_OPEN) : end if end >= 0 else len(text)]
        try:
            call = as_call(json.loads(inner), names)
        except ValueError:
            call = None
        if call is None:
            rest.append(text[: end + len(HERMES_CLOSE) if end >= 0 else len(text)])
        else:
            rest.append(text[:start])
            calls.append(call)
        text = text[end + len(HERMES_CLOSE) :] if end >= 0 else ""
    rest.append(text)
    return ("".join(rest).strip(), calls) if calls else None


def parse_llama3_json(text: str, names: frozenset[str]) -> Parsed | None:
    """``<|python_tag|>`` (optional) then JSON objects ``{"name", "parameters"}`` separated by ``;``."""
    text = text.lstrip().removeprefix(PYTHON_TAG)
    items = []
    while (found := _json_prefix(text)) is not None:
        value, text = found
        items.append(value)
        text = text.lstrip()
        if not text.startswith(";"):
            break
        text = text[1:]
    calls = _all_calls(items, names)
    return (text.strip(), calls) if calls else None


def parse_mistral(text: str, names: frozenset[str]) -> Parsed | None:
    """After each ``[TOOL_CALLS]``: a JSON list (or object) of calls, or ``name[ARGS]{json}`` (newer
    tokenizers); every segment must hold valid calls."""
    calls: list[ToolCall] = []
    rest: list[str] = []
    for segment in text.split(MISTRAL_CALLS)[1:]:
        segment = segment.strip()
        if named := _MISTRAL_NAMED.match(segment):
            found = _json_prefix(segment[named.end() :])
            items = [{"name": named.group(1), "arguments": found[0]}] if found else []
        else:
            found = _json_prefix(segment)
            items = (found[0] if isinstance(found[0], list) else [found[0]]) if found else []
        got = _all_calls(items, names)
        if got is None or found is None:
            return None
        calls += got
        rest.append(found[1].strip())
    return (" ".join(r for r in rest if r), calls) if calls else None


def _literal(node: ast.expr) -> Any:
    """A pythonic argument's value: a Python literal, or JSON's true, false and null."""
    if isinstance(node, ast.Name) and node.id in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[node.id]
    return ast.literal_eval(node)


def parse_pythonic(text: str, names: frozenset[str]) -> Parsed | None:
    """The whole answer is a Python list of calls with keyword arguments: ``[f(a=1), g(b="x")]``."""
    text = text.strip().removeprefix(PYTHON_START).removesuffix(PYTHON_END).strip()
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args):
            return None
        if node.func.id not in names or any(k.arg is None for k in node.keywords):
            return None
        try:
            arguments = {str(k.arg): _literal(k.value) for k in node.keywords}
        except (ValueError, TypeError, SyntaxError):
            return None
        calls.append(make_call(node.func.id, arguments))
    return "", calls


def parse_generic(text: str, names: frozenset[str]) -> Parsed | None:
    """The whole answer is JSON (a code fence around it is tolerated): the list of calls the generic
    prompt teaches, or one call, or ``{"tool_call": ...}`` / ``{"tool_calls": [...]}`` (llama.cpp's)."""
    text = _FENCE.sub("", text.strip(), count=1)
    found = _json_prefix(text)
    if found is None:
        return None
    value, rest = found
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        value = value["tool_calls"]
    elif isinstance(value, dict) and "tool_call" in value:
        value = [value["tool_call"]]
    calls = _all_calls(value if isinstance(value, list) else [value], names)
    return (rest.strip().removesuffix("```").strip(), calls) if calls else None


def required_calls(text: str) -> list[ToolCall]:
    """The calls of the JSON list that `required` and a named function are constrained to; none when
    it was cut short (max_tokens): then the text is content."""
    try:
        items = json.loads(text)
    except ValueError:
        return []
    items = items if isinstance(items, list) else [items]
    return [make_call(item["name"], item.get("arguments", {})) for item in items if isinstance(item, dict)]


FORMATS: dict[str, ToolFormat] = {
    "hermes": ToolFormat("hermes", TOOL_MARKERS["hermes"], (), parse_hermes),
    "llama3_json": ToolFormat("llama3_json", TOOL_MARKERS["llama3_json"], ("{",), parse_llama3_json),
    "mistral": ToolFormat("mistral", TOOL_MARKERS["mistral"], (), parse_mistral),
    "pythonic": ToolFormat("pythonic", TOOL_MARKERS["pythonic"], ("[",), parse_pythonic),
    "generic": ToolFormat("generic", TOOL_MARKERS["generic"], ("[", "{", "```"), parse_generic),
}

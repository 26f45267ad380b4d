"""The pythonic tool-call format's reader (Llama 3.2 and 4 pythonic templates, ToolACE): the whole
answer is a Python list of calls with keyword arguments, as vLLM's pythonic parser reads it.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from deployments.tools.regions import CallView, Region

PYTHON_END = "<|python_end|>"
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_SPACE = re.compile(r"\s*")


class PythonicRegion(Region):
    """``[get_weather(city="Paris"), add(a=1, b=2)]``, the whole answer (optionally between Llama 4's
    ``<|python_start|>`` and ``<|python_end|>``): keyword arguments that are Python literals (and
    JSON's true, false and null), sent as a JSON object one argument at a time.
    """

    def __init__(self, names: frozenset[str], opening: str) -> None:
        super().__init__(names, opening)
        self._pos = len(opening)
        self._state = "open"  # open, call, paren, key, equals, value, next_arg, next_call
        self._calls: list[CallView] = []
        self._arg_start = 0
        self._key = ""

    def _update(self, final: bool) -> None:
        while self.status == "open" and self._step(final):
            pass

    def _fail(self, at: int) -> bool:
        self._settle(self._calls, at)
        return False

    def _step(self, final: bool) -> bool:
        """Read one token; False when more text is needed (or the region is decided)."""
        text = self.text
        self._pos = _SPACE.match(text, self._pos).end()  # type: ignore[union-attr]
        if self._pos >= len(text):
            return False
        char, state = text[self._pos], self._state
        if state == "open":
            if char != "[":
                return self._fail(self._pos)
            self._pos, self._state = self._pos + 1, "call"
        elif state in ("call", "key"):
            word = _IDENTIFIER.match(text, self._pos)
            if word is None:
                return self._fail(self._pos)
            if word.end() == len(text) and not final:
                return False  # the name may go on
            if state == "call":
                if word.group() not in self.names:
                    return self._fail(self._pos)
                self._calls.append(CallView(self._pos, word.group()))
                self._state = "paren"
            else:
                self._key, self._state = word.group(), "equals"
            self._pos = word.end()
        elif state == "paren":
            if char != "(":
                return self._fail(self._calls.pop().start)
            self._pos, self._state = self._pos + 1, "key"
            if text.startswith(")", _SPACE.match(text, self._pos).end()):  # type: ignore[union-attr]
                self._state = "next_arg"
        elif state == "equals":
            if char != "=":
                return self._fail(self._pos)
            self._pos, self._state, self._arg_start = self._pos + 1, "value", self._pos + 1
        elif state == "value":
            end = _literal_end(text, self._arg_start)
            if end is None:
                return False if not final else self._fail(self._arg_start)
            try:
                value = _literal(ast.parse(text[self._arg_start : end].strip(), mode="eval").body)
            except (SyntaxError, ValueError, TypeError):
                return self._fail(self._arg_start)
            call = self._calls[-1]
            call.arguments += ("{" if not call.arguments else ", ") + f"{json.dumps(self._key)}: "
            call.arguments += json.dumps(value, ensure_ascii=False)
            call.ready = True  # sent from its first argument on: a positional one would make it no call
            self._pos, self._state = end, "next_arg"
        elif state == "next_arg":
            call = self._calls[-1]
            if char == ",":
                self._pos, self._state = self._pos + 1, "key"
            elif char == ")":
                call.arguments = call.arguments + "}" if call.arguments else "{}"
                call.ready = call.complete = True
                self._pos, self._state = self._pos + 1, "next_call"
            else:
                return self._fail(self._pos)
        elif state == "next_call":
            if char == ",":
                self._pos, self._state = self._pos + 1, "call"
            elif char == "]":
                self.calls = self._calls
                self._closing(self._pos + 1, PYTHON_END, final)
                return False
            else:
                return self._fail(self._pos)
        self.calls = self._calls
        return True


def _literal_end(text: str, start: int) -> int | None:
    """Where the Python literal at `start` ends (at a ``,`` or ``)`` outside brackets and strings);
    None when the text ends first.
    """
    depth, quote, pos = 0, "", start
    while pos < len(text):
        char = text[pos]
        if quote:
            if char == "\\":
                pos += 1
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                return pos if char == ")" else None
            depth -= 1
        elif char == "," and depth == 0:
            return pos
        pos += 1
    return None


def _literal(node: ast.expr) -> Any:
    """A pythonic argument's value: a Python literal, or JSON's true, false and null."""
    if isinstance(node, ast.Name) and node.id in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[node.id]
    return ast.literal_eval(node)

"""JSON read as it streams, for tool calls: `PartialJson` is fed text and keeps the tree of the value
read so far, each node with where it starts and, once closed, where it ends. A call's arguments can
then be sent while the model writes them, as their raw text (`raw`), which only grows: the text of
an open node is everything read since it started, and an escape sequence is read whole or not at
all. Text that can no longer become JSON is found at the first character that proves it (`failed`).

Lenient where models are and the reader loses nothing by it: control characters are accepted in
strings (as ``json.loads(strict=False)`` does). One character at a time, with runs of string
characters and whitespace taken by regular expressions: linear in the text, whatever the chunks.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

WHITESPACE = " \t\n\r"
_SPACE_RUN = re.compile(r"[ \t\n\r]+")
_STRING_RUN = re.compile(r'[^"\\]+')
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_LITERALS = ("true", "false", "null")
_ESCAPES = frozenset('"\\/bfnrt')
_HEX = frozenset("0123456789abcdefABCDEF")
_UNSET = object()

Kind = Literal["object", "array", "string", "number", "literal"]
# What an open container expects next.
_State = Literal["key_or_close", "key", "colon", "value", "value_or_close", "comma_or_close"]


@dataclass(eq=False)
class JsonNode:
    """A value in the text: `start` and `end` (exclusive; None while it is open) are offsets in the
    reader's text. An array's values are `items`; an object's are `values`, its keys `keys` (one
    more key than values while a key waits for its value).
    """

    kind: Kind
    start: int
    end: int | None = None
    items: list[JsonNode] = field(default_factory=list)
    keys: list[JsonNode] = field(default_factory=list)
    values: list[JsonNode] = field(default_factory=list)
    _value: Any = _UNSET

    @property
    def closed(self) -> bool:
        return self.end is not None


class PartialJson:
    """One JSON value, fed as it streams. `root` is its tree so far, `done` once it has closed (the
    text after it is not read), `failed` the offset where the text stopped being JSON.
    """

    def __init__(self) -> None:
        self.text = ""
        self.pos = 0  # characters read
        self.root: JsonNode | None = None
        self.failed: int | None = None
        self._open: list[JsonNode] = []
        self._states: list[_State] = []  # one per open object or array

    @property
    def done(self) -> bool:
        return self.root is not None and self.root.closed

    def feed(self, text: str) -> None:
        self.text += text
        self._read()

    def finish(self) -> None:
        """The text has ended: a number still open (``12``) is complete now."""
        if self._open and self._open[-1].kind == "number" and self.failed is None:
            self._close_number(len(self.text))

    def raw(self, node: JsonNode) -> str:
        """The node's text as the model wrote it, so far (up to where the text stopped being JSON)."""
        if node.end is not None:
            return self.text[node.start : node.end]
        return self.text[node.start : self.pos if self.failed is None else self.failed]

    def value(self, node: JsonNode) -> Any:
        """A closed string, number or literal's value (decoded once)."""
        if node._value is _UNSET:
            node._value = json.loads(self.raw(node), strict=False)
        return node._value

    def members(self, node: JsonNode) -> list[tuple[str, JsonNode]]:
        """An object's members whose key is complete and whose value has started."""
        return [(self.value(key), value) for key, value in zip(node.keys, node.values, strict=False)]

    # ------------------------------------------------------------------ the reader

    def _read(self) -> None:
        text = self.text
        while self.pos < len(text) and self.failed is None and not self.done:
            top = self._open[-1] if self._open else None
            if top is not None and top.kind == "string":
                if not self._read_string(top):
                    return  # an escape sequence waits for its end
                continue
            char = text[self.pos]
            if top is not None and top.kind == "number":
                if char in _NUMBER_CHARS:
                    self.pos += 1
                else:
                    self._close_number(self.pos)
                continue
            if top is not None and top.kind == "literal":
                self.pos += 1
                self._check_literal(top)
                continue
            if char in WHITESPACE:
                self.pos = _SPACE_RUN.match(text, self.pos).end()  # type: ignore[union-attr]
                continue
            self._read_structure(char)

    def _read_structure(self, char: str) -> None:
        state: _State = self._states[-1] if self._states else "value"
        if state in ("key_or_close", "key"):
            if char == '"':
                self._start("string", as_key=True)
            elif char == "}" and state == "key_or_close":
                self._close_container()
            else:
                self.failed = self.pos
        elif state == "colon":
            if char == ":":
                self._states[-1] = "value"
                self.pos += 1
            else:
                self.failed = self.pos
        elif state == "comma_or_close":
            container = self._open[-1]
            if char == ",":
                self._states[-1] = "key" if container.kind == "object" else "value"
                self.pos += 1
            elif char == ("}" if container.kind == "object" else "]"):
                self._close_container()
            else:
                self.failed = self.pos
        elif state == "value_or_close" and char == "]":
            self._close_container()
        else:
            self._start_value(char)

    def _start_value(self, char: str) -> None:
        if char == "{":
            self._start("object")
        elif char == "[":
            self._start("array")
        elif char == '"':
            self._start("string")
        elif char == "-" or char.isdigit():
            self._start("number")
        elif char in "tfn":
            self._start("literal")
        else:
            self.failed = self.pos

    def _start(self, kind: Kind, as_key: bool = False) -> None:
        node = JsonNode(kind, self.pos)
        parent = self._open[-1] if self._open else None
        if parent is None:
            self.root = node
        elif as_key:
            parent.keys.append(node)
        elif parent.kind == "object":
            parent.values.append(node)
        else:
            parent.items.append(node)
        self._open.append(node)
        if kind == "object":
            self._states.append("key_or_close")
        elif kind == "array":
            self._states.append("value_or_close")
        self.pos += 1
        if kind == "literal":
            self._check_literal(node)

    def _read_string(self, node: JsonNode) -> bool:
        """Read string characters; False when an escape sequence is incomplete (wait for more)."""
        text = self.text
        run = _STRING_RUN.match(text, self.pos)
        if run is not None:
            self.pos = run.end()
            return True
        if text[self.pos] == '"':
            self.pos += 1
            self._closed(node)
            return True
        escape = text[self.pos + 1 : self.pos + 6]  # the backslash's sequence, as far as it is written
        if not escape:
            return False
        if escape[0] in _ESCAPES:
            self.pos += 2
            return True
        if escape[0] != "u" or any(c not in _HEX for c in escape[1:]):
            self.failed = self.pos
            return True
        if len(escape) < 5:
            return False
        self.pos += 6
        return True

    def _check_literal(self, node: JsonNode) -> None:
        word = self.text[node.start : self.pos]
        if word in _LITERALS:
            self._closed(node)
        elif not any(literal.startswith(word) for literal in _LITERALS):
            self.failed = self.pos - 1

    def _close_number(self, at: int) -> None:
        node = self._open[-1]
        if _NUMBER.fullmatch(self.text, node.start, at) is None:
            self.failed = node.start
            return
        self._closed(node)

    def _close_container(self) -> None:
        self.pos += 1
        self._states.pop()
        self._closed(self._open[-1])

    def _closed(self, node: JsonNode) -> None:
        """`node` ends here; its container moves on."""
        node.end = self.pos
        self._open.pop()
        if not self._states or not self._open:
            return
        parent, state = self._open[-1], self._states[-1]
        if parent.kind == "object" and state in ("key_or_close", "key"):
            self._states[-1] = "colon"
        else:
            self._states[-1] = "comma_or_close"

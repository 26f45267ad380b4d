"""The readers of tool calls in a model's text (`formats` says which format uses which): a
`Region` is the text from a marker or lead on, read as it streams. It says the calls written so far
(`CallView`: the name once it is complete and names one of the request's tools, the arguments as
JSON text that only grows), and whether the region is still `open`, `done` (its syntax ended at
`end`: what follows is content again) or `failed` (the text stopped being calls at `end`).

A call is `ready` to be sent once its name is known and its arguments can only be a JSON object:
from then on it is a call, even if the text is cut (`max_tokens`) or breaks later; before, text
that turns out to be no call (not the format's syntax, an unknown name, arguments that are no
object) stays content. This module reads the JSON forms (`JsonRegion`, `MistralRegion`);
`pythonic` the pythonic one.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

from deployments.tools.partial_json import WHITESPACE, JsonNode, PartialJson

FENCE = "```"
MISTRAL_ARGS = "[ARGS]"
_FENCE_LINE = re.compile(r"```[A-Za-z]*[ \t]*\n?")
_MISTRAL_NAMED = re.compile(r"\s*([A-Za-z_][\w.\-]*)\s*(?:\[CALL_ID\]\s*\S+?\s*)?\[ARGS\]\s*")
_MISTRAL_NAME_MAX = 256  # characters before [ARGS] after which the named form is given up

Status = Literal["open", "done", "failed"]


@dataclass
class CallView:
    """One call as far as it is written: `start` (its offset in the region), `name` (complete, one of
    the request's tools), `arguments` (JSON text so far), `ready` (it may be sent), `complete`.
    """

    start: int
    name: str | None = None
    arguments: str = ""
    ready: bool = False
    complete: bool = False


class Region(ABC):
    """The text from a marker or lead on, read as it streams (`feed`, then `finish` at the end)."""

    def __init__(self, names: frozenset[str], opening: str) -> None:
        self.names = names
        self.opening = opening  # the marker that opened the region ("" for a lead)
        self.text = ""
        self.status: Status = "open"
        self.end = 0
        self.calls: list[CallView] = []

    def feed(self, text: str) -> None:
        self.text += text
        if self.status == "open":
            self._update(final=False)

    def finish(self) -> None:
        if self.status == "open":
            self._update(final=True)

    @abstractmethod
    def _update(self, final: bool) -> None:
        """Read the text so far: set `calls`, and `status` and `end` once decided."""

    def _settle(self, calls: list[CallView], bad: int | None) -> bool:
        """`calls` so far; `bad`: where the text stopped being calls, if it did. A call that was not
        ready when the text broke inside it is no call: the region fails where it started. True when
        the region failed.
        """
        if bad is not None and calls and not calls[-1].ready and not calls[-1].complete:
            bad = min(bad, calls.pop().start)
        self.calls = calls
        if bad is not None:
            self.status, self.end = "failed", bad
        return bad is not None

    def _closing(self, at: int, closing: str, final: bool) -> None:
        """The calls' syntax ended at `at`; an optional `closing` (after whitespace) belongs to it."""
        rest = self.text[at:]
        body = rest.lstrip()
        if closing and body.startswith(closing):
            self.status, self.end = "done", at + len(rest) - len(body) + len(closing)
        elif closing and closing.startswith(body) and not final:
            return  # it may still come
        else:
            self.status, self.end = "done", at


def json_call(doc: PartialJson, node: JsonNode, names: frozenset[str], at: int) -> CallView | None:
    """`{"name": ..., "arguments" (or "parameters"): {...}}` as a call (`at`: the document's offset in
    the region); None when it is no call of `names`. Arguments written as JSON text (a string) count
    once the string is complete; no arguments are ``{}``.
    """
    if node.kind != "object":
        return None
    view = CallView(at + node.start)
    args: JsonNode | None = None
    named = False
    for key, value in doc.members(node):
        if key == "name" and not named:
            named = True
            if value.kind != "string":
                return None
            if value.closed:
                name = doc.value(value)
                if name not in names:
                    return None
                view.name = name
        elif key in ("arguments", "parameters") and args is None:
            args = value
    streamable = False
    if args is None:
        view.arguments = "{}" if node.closed else ""
    elif args.kind == "object":
        view.arguments, streamable = doc.raw(args), True
    elif args.kind == "string" and args.closed:
        text = doc.value(args)
        try:
            if not isinstance(json.loads(text), dict):
                return None
        except ValueError:
            return None
        view.arguments = text.strip()
    elif args.kind != "string":
        return None
    if node.closed and view.name is None:
        return None
    view.complete = node.closed
    view.ready = view.name is not None and (streamable or view.complete or bool(view.arguments))
    return view


def json_calls(doc: PartialJson, names: frozenset[str], at: int) -> tuple[list[CallView], int | None]:
    """The calls of a whole JSON document: a list of calls, one call, or ``{"tool_call": ...}`` /
    ``{"tool_calls": [...]}`` (llama.cpp's generic format); and where it stopped being calls.
    """
    root = doc.root
    if root is None:
        return [], None
    items = [root]
    if root.kind == "array":
        items = root.items
    elif root.kind == "object" and (members := doc.members(root)):
        key, value = members[0]
        if key == "tool_calls":
            if value.kind != "array":
                return [], at + root.start
            items = value.items
        elif key == "tool_call":
            items = [value]
    calls: list[CallView] = []
    for item in items:
        view = json_call(doc, item, names, at)
        if view is None:
            return calls, at + item.start
        calls.append(view)
    if root.closed and not calls:
        return [], at + root.start  # JSON, but no call in it
    return calls, None


class JsonRegion(Region):
    """JSON after the opening (a marker, or nothing for a lead): one document, or several separated
    by `separator` (llama3_json's ``;``); each is one call object (`one_call`) or any of the
    whole-answer forms (`json_calls`); then an optional `closing` (Hermes' ``</tool_call>``). With
    `fenced` (the generic format), a code fence around it is read too.
    """

    def __init__(
        self,
        names: frozenset[str],
        opening: str,
        *,
        closing: str = "",
        separator: str = "",
        one_call: bool = False,
        fenced: bool = False,
    ) -> None:
        super().__init__(names, opening)
        self._closing_text, self._separator, self._one_call, self._fenced = closing, separator, one_call, fenced
        self._docs: list[tuple[int, PartialJson]] = []  # (offset in the region, reader)
        self._done: list[CallView] = []  # the calls of the documents before the last

    def _update(self, final: bool) -> None:
        if not self._docs:
            start = self._body_start(final)
            if start is None:
                return
            self._docs.append((start, PartialJson()))
        while True:
            at, doc = self._docs[-1]
            doc.feed(self.text[at + len(doc.text) :])
            if final:
                doc.finish()
            found, bad = self._read(doc, at)
            if doc.failed is not None:
                bad = at + doc.failed if bad is None else min(bad, at + doc.failed)
            if self._settle(self._done + found, bad) or not doc.done:
                return
            if not self._next_document(at + doc.pos, final):
                return
            self._done += found

    def _read(self, doc: PartialJson, at: int) -> tuple[list[CallView], int | None]:
        if not self._one_call:
            return json_calls(doc, self.names, at)
        if doc.root is None:
            return [], None
        view = json_call(doc, doc.root, self.names, at)
        return ([], at + doc.root.start) if view is None else ([view], None)

    def _next_document(self, after: int, final: bool) -> bool:
        """After a document: the next one (True), or the closing and the region's end."""
        rest = self.text[after:]
        body = rest.lstrip()
        if self._separator and body.startswith(self._separator):
            start = after + len(rest) - len(body) + len(self._separator)
            self._docs.append((start, PartialJson()))
            return True
        if self._separator and not body and not final:
            return False  # a separator may still come
        self._closing(after, self._closing_text, final)
        return False

    def _body_start(self, final: bool) -> int | None:
        """Where the first document starts: after the opening, and a fence line (generic); None
        while that is not known yet.
        """
        at = len(self.opening)
        if not self._fenced or not self.text.startswith("`"):
            return at
        line = _FENCE_LINE.match(self.text)
        if line is None:
            if FENCE.startswith(self.text) and not final:
                return None
            self._settle([], 0)
            return None
        if line.end() == len(self.text) and not final:
            return None  # the fence line may go on
        self._closing_text = FENCE
        return line.end()


class MistralRegion(Region):
    """After ``[TOOL_CALLS]``: a JSON list (or object) of calls, or ``name[ARGS]{json}`` (newer
    tokenizers, with an optional ``[CALL_ID]id`` before ``[ARGS]``).
    """

    def __init__(self, names: frozenset[str], opening: str) -> None:
        super().__init__(names, opening)
        self._json: JsonRegion | None = None
        self._args_at: int | None = None
        self._name: str | None = None
        self._doc = PartialJson()

    def _update(self, final: bool) -> None:
        body = self.text[len(self.opening) :]
        if self._json is None and self._args_at is None:
            first = body.lstrip(WHITESPACE)[:1]
            if not first:
                if final:
                    self._settle([], 0)
                return
            if first in "[{":
                self._json = JsonRegion(self.names, self.opening)
            elif not self._find_name(body, final):
                return
        if self._json is not None:
            self._json.feed(self.text[len(self._json.text) :])
            if final:
                self._json.finish()
            self.calls, self.status, self.end = self._json.calls, self._json.status, self._json.end
            return
        self._named(final)

    def _find_name(self, body: str, final: bool) -> bool:
        """The named form's name, once ``[ARGS]`` is written; False while it is not (or on failure)."""
        named = _MISTRAL_NAMED.match(body)
        if named is None:
            if MISTRAL_ARGS in body or final or len(body) > _MISTRAL_NAME_MAX:
                self._settle([], 0)
            return False
        if named.group(1) not in self.names:
            self._settle([], 0)
            return False
        self._name, self._args_at = named.group(1), len(self.opening) + named.end()
        return True

    def _named(self, final: bool) -> None:
        assert self._args_at is not None
        doc = self._doc
        doc.feed(self.text[self._args_at + len(doc.text) :])
        if final:
            doc.finish()
        view = CallView(0, self._name)
        root = doc.root
        bad = None if doc.failed is None else self._args_at + doc.failed
        if root is not None and root.kind != "object":
            bad = 0
        elif root is not None:
            view.arguments, view.ready, view.complete = doc.raw(root), True, root.closed
        if not self._settle([view], bad) and doc.done:
            self._closing(self._args_at + doc.pos, "", final)

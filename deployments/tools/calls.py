"""One choice's text split into content and tool calls as it streams, sent as OpenAI sends them.

`ToolCallText.feed` takes the model's text as it comes and returns what can be sent now, in order:
content, and tool-call deltas as vLLM and OpenAI stream them: a call's first delta has its `id`,
`type` and `function.name` (and the arguments written so far), the next ones `function.arguments`
fragments. The arguments are the model's own JSON text (the pythonic format's, written as JSON), so
the fragments concatenated are the whole answer's arguments, whatever the chunks; `calls` is the
whole answer's calls, the same text.

Content is sent as soon as it cannot be the start of a call (a marker such as ``<tool_call>``, or,
while the answer may still be one call, a lead such as ``[``); leading whitespace is dropped, and
content that resumes after calls is joined to the earlier content with one space. Text that turns
out to be no call (`regions`: before a call is `ready`) is content.

An answer ends early (`stopped`), and the caller stops its generation, when a call repeats an
earlier one of the same answer (same name, same arguments up to JSON whitespace): the repeat is
dropped. A small model made to call a tool (`required`, or a named function, with parallel calls
allowed) tends to write the same call again and again until `max_tokens`; a call made twice with
the same arguments in one turn has nothing to add (its result would be the same). Until a call
with an earlier call's name differs from it, its deltas are held back, so a repeat is never sent.
With `parallel_tool_calls` false the answer ends after its first call (vLLM keeps only the first).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from deployments.protocol.openai.chat import ToolCallDelta, ToolCallDeltaFunction
from deployments.protocol.openai.common import ToolCall, ToolCallFunction
from deployments.tools.formats import FORMATS, ToolFormat, generic_region
from deployments.tools.plan import ToolPlan
from deployments.tools.regions import CallView, Region

Piece = str | ToolCallDelta  # content, or a tool call's delta
_JSON_TOKEN = re.compile(r'("(?:[^"\\]|\\.)*"?)|\s+')


def call_id(prefix: str = "call_") -> str:
    """A new tool call's id: OpenAI's APIs use `call_`, Anthropic's `toolu_`."""
    return f"{prefix}{secrets.token_hex(12)}"


def compact(arguments: str) -> str:
    """JSON text without the whitespace between its tokens (also a prefix of it)."""
    return _JSON_TOKEN.sub(lambda m: m.group(1) or "", arguments)


@dataclass
class _Call:
    id: str
    name: str
    sent: str = ""  # the arguments sent so far
    announced: bool = False  # its first delta is sent (held back while it may repeat an earlier call)
    complete: bool = False


class ToolCallText:
    """One choice's text: `use` names the model's format (before the first `feed`); `feed` returns
    the pieces that can be sent now; `finish` what is left at the end of the text.
    """

    def __init__(self, plan: ToolPlan, id_prefix: str = "call_") -> None:
        self.plan = plan
        self.id_prefix = id_prefix
        self.format: ToolFormat = FORMATS["hermes"]
        self.stopped = False  # the answer ended early: stop its generation
        self._held = ""  # content that may still open a call, or trailing whitespace
        self._leading = True  # only whitespace so far: a lead may still open a call
        self._started = False  # some content has been sent
        self._gap = False  # calls came since the last content: content resumes after one space
        self._before = ""  # whitespace before the open region (content again if it holds no call)
        self._calls: list[_Call] = []
        self._first = 0  # the open region's first call, in `_calls`
        self._region: Region | None = None
        if plan.mode in ("required", "named"):  # the whole answer is the constrained JSON list
            self._region, self._leading = generic_region(plan.names), False

    def use(self, name: str | None) -> None:
        if name in FORMATS:
            self.format = FORMATS[name]

    @property
    def calls(self) -> list[ToolCall]:
        return [
            ToolCall(id=c.id, function=ToolCallFunction(name=c.name, arguments=c.sent))
            for c in self._calls
            if c.announced
        ]

    @property
    def complete(self) -> bool:
        """Every call of the answer is complete (none was cut short)."""
        return all(call.complete for call in self._calls if call.announced)

    def feed(self, text: str) -> list[Piece]:
        if self.plan.mode == "none":
            return [text] if text else []
        out: list[Piece] = []
        self._read(text, out, final=False)
        return out

    def finish(self) -> list[Piece]:
        if self.plan.mode == "none":
            return []
        out: list[Piece] = []
        self._read("", out, final=True)
        return out

    # ------------------------------------------------------------------ reading

    def _read(self, text: str, out: list[Piece], final: bool) -> None:
        while not self.stopped:
            region = self._region
            if region is None:
                text = self._scan(text, out)
                if self._region is None:
                    if final:
                        self._flush(out)
                    return
                continue
            region.feed(text)
            if final:
                region.finish()
            self._send(region, out)
            if self.stopped or region.status == "open":
                if final and not self.stopped:
                    self._end_region(region, out, cut=True)
                return
            text = self._end_region(region, out)

    def _scan(self, text: str, out: list[Piece]) -> str:
        """Content mode: send what cannot open a call; on a marker or lead, open a region and return
        its text (else "").
        """
        held = self._held + text
        if self.plan.mode != "auto":
            self._content(held, out)
            return ""
        if self._leading:
            body, leads = held.lstrip(), self.format.leads
            if not body or any(lead.startswith(body) for lead in leads):
                self._held = held
                return ""
            self._leading = False
            if any(body.startswith(lead) for lead in leads):
                return self._open("", body, "")
        found = [(at, marker) for marker in self.format.markers if (at := held.find(marker)) >= 0]
        if found:
            at, marker = min(found)
            self._content(held[:at], out)
            return self._open(marker, held[at:], self._held)
        keep = _partial_marker(held, self.format.markers)
        self._content(held[: len(held) - keep], out, keep=held[len(held) - keep :])
        return ""

    def _open(self, marker: str, text: str, before: str) -> str:
        self._region = self.format.region(self.plan.names, marker)
        self._held, self._before, self._first = "", before, len(self._calls)
        return text

    def _end_region(self, region: Region, out: list[Piece], cut: bool = False) -> str:
        """The region is decided (or `cut` at the end of the text): the text to read as content next."""
        self._region = None
        self._calls = [call for call in self._calls if call.announced]  # a call held back to the end is none
        if len(self._calls) > self._first:  # it held calls: what follows its syntax is content
            self._gap = True
            return "" if cut else region.text[region.end :]
        # No call: its text is content (the marker as it is, the rest read again for calls).
        self._held = self._before
        if cut or self.plan.mode != "auto":
            self._content(self._held + region.text, out)
            return ""
        if region.opening:
            self._content(self._held + region.opening, out)
            return region.text[len(region.opening) :]
        return region.text

    def _send(self, region: Region, out: list[Piece]) -> None:
        """The region's ready calls as deltas: a new call's first delta, then its arguments' growth."""
        for offset, view in enumerate(region.calls):
            if not view.ready:
                return
            index = self._first + offset
            if index == len(self._calls):
                assert view.name is not None
                self._calls.append(_Call(call_id(self.id_prefix), view.name))
            call = self._calls[index]
            if not call.announced:
                if view.complete and self._repeats(index, view):
                    del self._calls[index:]
                    self.stopped = True
                    return
                if not view.complete and self._may_repeat(index, view):
                    return  # held back until it differs from the earlier call (no later call is ready)
                call.announced, call.sent = True, view.arguments
                function = ToolCallDeltaFunction(name=call.name, arguments=call.sent)
                out.append(ToolCallDelta(index=index, id=call.id, type="function", function=function))
            elif len(view.arguments) > len(call.sent):
                fragment, call.sent = view.arguments[len(call.sent) :], view.arguments
                out.append(ToolCallDelta(index=index, function=ToolCallDeltaFunction(arguments=fragment)))
            if view.complete and not call.complete:
                call.complete = True
                if not self.plan.parallel:
                    self.stopped = True
                    return

    def _may_repeat(self, index: int, view: CallView) -> bool:
        """The call's arguments so far begin an earlier complete call's with the same name."""
        written = compact(view.arguments)
        return any(
            c.complete and c.name == view.name and compact(c.sent).startswith(written) for c in self._calls[:index]
        )

    def _repeats(self, index: int, view: CallView) -> bool:
        written = compact(view.arguments)
        return any(c.complete and c.name == view.name and compact(c.sent) == written for c in self._calls[:index])

    # ------------------------------------------------------------------ content

    def _content(self, ready: str, out: list[Piece], keep: str = "") -> None:
        """Send `ready` but its trailing whitespace (held: dropped if a call follows); `keep` is held."""
        body = ready.rstrip()
        self._held = ready[len(body) :] + keep
        if not body:
            return
        if not self._started:
            body = body.lstrip()
        elif self._gap:
            body = " " + body.lstrip()
        self._started, self._gap = True, False
        out.append(body)

    def _flush(self, out: list[Piece]) -> None:
        """The end of the text: what was held is content (trailing whitespace too, unless calls came)."""
        tail, self._held = self._held, ""
        if self._gap or not self._started:
            self._content(tail, out)
        elif tail:
            out.append(tail)


def _partial_marker(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that is a proper prefix of a marker."""
    for n in range(min(max((len(m) for m in markers), default=1) - 1, len(text)), 0, -1):
        if any(marker.startswith(text[-n:]) for marker in markers):
            return n
    return 0

"""Tool calls in a model's text, one reader per tool-call format (`capabilities.tool_call_format`,
which the decoder names on a request's first chunk; the formats: `deployments.config.chat`), and the
strings that open a call in each (`TOOL_MARKERS`: an engine keeps them in the decoded text when they
are special tokens; the readers look for them).

A `ToolFormat` says where calls may start: at a `marker` anywhere in the text (a token such as
``<tool_call>`` or ``[TOOL_CALLS]``: the text before it is content), or at a `lead` that opens the
answer (``{``, ``[``: a JSON or pythonic call is the whole answer, as vLLM's llama3_json and
pythonic parsers read it). From there the format's `Region` (`regions`,
`pythonic`) reads the text as it streams and says the calls written so far;
`calls.ToolCallText` sends them as OpenAI's deltas.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from deployments.config import ToolCallFormat
from deployments.tools.pythonic import PythonicRegion
from deployments.tools.regions import FENCE, JsonRegion, MistralRegion, Region

HERMES_CLOSE = "</tool_call>"

TOOL_MARKERS: dict[ToolCallFormat, tuple[str, ...]] = {
    "hermes": ("<tool_call>",),
    "llama3_json": ("<|python_tag|>",),
    "mistral": ("[TOOL_CALLS]",),
    "pythonic": ("<|python_start|>",),
    "generic": (),
}


@dataclass(frozen=True)
class ToolFormat:
    """A tool-call format: where its calls may start in an answer, and the region that reads them."""

    name: ToolCallFormat
    markers: tuple[str, ...]  # open calls anywhere
    leads: tuple[str, ...]  # open calls at the start of the answer only
    region: Callable[[frozenset[str], str], Region]  # (the request's tool names, the opening marker)


def generic_region(names: frozenset[str], opening: str = "") -> Region:
    """The generic format's answer, and the JSON list that `required` and a named function are
    constrained to (every format).
    """
    return JsonRegion(names, opening, fenced=True)


FORMATS: dict[str, ToolFormat] = {
    "hermes": ToolFormat(
        "hermes",
        TOOL_MARKERS["hermes"],
        (),
        lambda names, opening: JsonRegion(names, opening, closing=HERMES_CLOSE, one_call=True),
    ),
    "llama3_json": ToolFormat(
        "llama3_json",
        TOOL_MARKERS["llama3_json"],
        ("{",),
        lambda names, opening: JsonRegion(names, opening, separator=";", one_call=True),
    ),
    "mistral": ToolFormat("mistral", TOOL_MARKERS["mistral"], (), MistralRegion),
    "pythonic": ToolFormat("pythonic", TOOL_MARKERS["pythonic"], ("[",), PythonicRegion),
    "generic": ToolFormat("generic", TOOL_MARKERS["generic"], ("[", "{", FENCE), generic_region),
}

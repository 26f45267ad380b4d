"""Tool calls in the model's text: the split into content and calls does not depend on how the text
was cut into chunks (a property test), and the parser keeps what is not a call."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from deployments.ingress.tools import ToolCallText, ToolPlan

PLAN = ToolPlan("auto", tools=[], names=frozenset({"get_weather", "add"}))
CALLS = st.sampled_from(
    [
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
        "<tool_call>not json</tool_call>",
        '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>',
        "<tool_",
        "<",
    ]
)
TEXT = st.text(alphabet="ab <>_\n", max_size=12)
OUTPUT = st.lists(TEXT | CALLS, max_size=5).map("".join)


def split(text: str, cuts: list[int]) -> tuple[str, list[tuple[str, dict]]]:
    """Feed `text` cut at `cuts`; the content and the calls (name, arguments) that come out."""
    reader = ToolCallText(PLAN)
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    content = "".join(reader.feed(text[a:b]) for a, b in itertools.pairwise(bounds))
    tail, calls = reader.finish()
    return content + tail, [(c.function.name, json.loads(c.function.arguments)) for c in calls]


@settings(max_examples=300, deadline=None)
@given(OUTPUT, st.lists(st.integers(0, 200), max_size=8))
def test_the_split_does_not_depend_on_the_chunks(text, cuts):
    assert split(text, cuts) == split(text, [])


@settings(max_examples=200, deadline=None)
@given(OUTPUT)
def test_text_without_a_valid_call_is_kept_whole_as_content(text):
    content, calls = split(text, [])
    if not calls:
        assert content == text.lstrip()
    else:
        assert "get_weather" not in content or "<tool_call>" in content  # a valid block never stays in the text


def test_calls_and_the_text_around_them():
    text = (
        'Sure. <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>\n'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    )
    assert split(text, [3, 9, 20]) == ("Sure.", [("add", {"a": 1}), ("get_weather", {"city": "Oslo"})])

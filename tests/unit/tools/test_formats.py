"""Tool calls in the model's text, per tool-call format: outputs as each family's models write them
(from their chat templates' instructions and vLLM's and llama.cpp's parser tests), split into content
and calls whole and fed in random chunkings (property tests: the split never depends on the chunks),
and text that is no valid call kept as content."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deployments.tools.calls import Piece, ToolCallText
from deployments.tools.formats import FORMATS
from deployments.tools.plan import ToolPlan, closed

PLAN = ToolPlan("auto", tools=[], names=frozenset({"get_weather", "add"}))
PARIS = ("get_weather", {"city": "Paris"})
ADD = ("add", {"a": 1, "b": 2})

# (format, the model's text, the content, the calls)
RECORDED = [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "", [PARIS]),
    (
        "hermes",
        "I'll check both.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
        "I'll check both.",
        [PARIS, ADD],
    ),
    ("hermes", "The weather in Paris is mild.", "The weather in Paris is mild.", []),
    (  # cut short (max_tokens): a call once its arguments have begun, with what was written
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": ',
        "",
        [("get_weather", '{"city": ')],
    ),
    ("hermes", '<tool_call>\n{"name": "get_weather", "argu', None, []),  # cut before: content
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
    ("llama3_json", '{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}', "", [PARIS]),
    (
        "llama3_json",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "add", "parameters": {"a": 1, "b": 2}}',
        "",
        [PARIS, ADD],
    ),
    ("llama3_json", 'Sure: <|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}', "Sure:", [ADD]),
    ("llama3_json", '{"answer": 42}', None, []),
    ("llama3_json", "It is sunny in Paris.", None, []),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]', "", [PARIS]),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}, '
        '{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        "",
        [ADD, PARIS],
    ),
    ("mistral", 'Let me look.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "Let me look.", [PARIS]),
    (
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}',
        "",
        [PARIS, ADD],
    ),
    ("mistral", "[TOOL_CALLS] [{'name': 'add'}]", None, []),
    ("mistral", "No tool is needed [here].", None, []),
    ("pythonic", '[get_weather(city="Paris")]', "", [PARIS]),
    ("pythonic", "[get_weather(city='Paris'), add(a=1, b=2)]", "", [PARIS, ADD]),
    ("pythonic", '<|python_start|>[get_weather(city="Paris")]<|python_end|>', "", [PARIS]),
    ("pythonic", "[add(a=1, b=2, c=true)]", "", [("add", {"a": 1, "b": 2, "c": True})]),
    ("pythonic", "[1, 2, 3] are numbers.", None, []),
    ("pythonic", "[unknown(x=1)]", None, []),
    ("generic", '[{"name": "get_weather", "arguments": {"city": "Paris"}}]', "", [PARIS]),
    (
        "generic",
        ' \n[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "add", "arguments": {"a": 1, "b": 2}}]',
        "",
        [PARIS, ADD],
    ),
    ("generic", '```json\n[{"name": "get_weather", "arguments": {"city": "Paris"}}]\n```', "", [PARIS]),
    ("generic", '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}', "", [PARIS]),
    ("generic", '{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}', "", [ADD]),
    ("generic", '[{"name": "get_weather", "arguments": {"city": "Paris"}}] Done.', "Done.", [PARIS]),
    ("generic", "Hello! How can I help you today?", None, []),
    ("generic", '[{"name": "get_weather", "arguments": {"city": "Par', "", [("get_weather", '{"city": "Par')]),
    ("generic", '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_weather", "arg', "", [PARIS]),
    ("generic", '{"city": "Paris"}', None, []),  # JSON, but no call
    ("generic", "Use `[x]` here: [1]", None, []),
]


def arguments(text: str) -> object:
    """A call's arguments as a value when they are complete JSON, else their text (cut short)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def read(fmt: str, text: str, cuts: list[int], plan: ToolPlan = PLAN) -> tuple[list[Piece], ToolCallText]:
    """Feed `text` cut at `cuts` (until the reader stops); the pieces sent, and the reader."""
    reader = ToolCallText(plan)
    reader.use(fmt)
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    pieces: list[Piece] = []
    for a, b in itertools.pairwise(bounds):
        pieces += reader.feed(text[a:b])
        if reader.stopped:
            return pieces, reader
    return pieces + reader.finish(), reader


def split(fmt: str, text: str, cuts: list[int], plan: ToolPlan = PLAN) -> tuple[str, list[tuple[str, object]]]:
    """The content and the calls (name, arguments) that come out of `text` fed in chunks."""
    pieces, reader = read(fmt, text, cuts, plan)
    content = "".join(p for p in pieces if isinstance(p, str))
    return content, [(c.function.name, arguments(c.function.arguments)) for c in reader.calls]


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), RECORDED)
def test_recorded_outputs(fmt, text, content, calls):
    expected = (text.lstrip() if content is None else content, calls)
    assert split(fmt, text, []) == expected


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(RECORDED), st.lists(st.integers(0, 400), max_size=10))
def test_a_recorded_output_streamed_in_any_chunks_splits_the_same(recorded, cuts):
    fmt, text, _, _ = recorded
    assert split(fmt, text, cuts) == split(fmt, text, [])


def test_streaming_holds_back_only_what_may_open_a_call():
    """Content is sent as soon as it cannot be a call's start: a marker format holds a partial marker,
    a lead format holds the answer only while it opens like a call."""
    hermes = ToolCallText(PLAN)
    assert [hermes.feed(t) for t in ("Sure, ", "<tool", "ing> is a word")] == [["Sure,"], [], [" <tooling> is a word"]]
    generic = ToolCallText(PLAN)
    generic.use("generic")
    assert [generic.feed(t) for t in (" ", "`", "`", "x is code")] == [[], [], [], ["``x is code"]]
    held = ToolCallText(PLAN)
    held.use("generic")
    assert [held.feed(t) for t in ("[", '{"na', 'me": 1}] and text')] == [[], [], ['[{"name": 1}] and text']]
    assert held.finish() == [] and held.calls == []


HERMES_CALLS = [
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
]
CALLS = st.sampled_from(
    [
        *HERMES_CALLS,
        "<tool_call>not json</tool_call>",
        '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>',
        '[{"name": "add", "arguments": {"a": 1}}]',
        '[add(a=1), get_weather(city="Oslo")]',
        '<|python_tag|>{"name": "add", "parameters": {"b": 2}}; ',
        '[TOOL_CALLS]add[ARGS]{"a": 3}',
        "<tool_",
        "<",
        "[",
        "{",
        "```",
    ]
)
TEXT = st.text(alphabet="ab <>_[]{}()=,;\n", max_size=12)
OUTPUT = st.lists(TEXT | CALLS, max_size=5).map("".join)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(sorted(FORMATS)), OUTPUT, st.lists(st.integers(0, 200), max_size=8))
def test_the_split_does_not_depend_on_the_chunks(fmt, text, cuts):
    assert split(fmt, text, cuts) == split(fmt, text, [])


@settings(max_examples=200, deadline=None)
@given(OUTPUT)
def test_text_without_a_valid_call_is_kept_whole_as_content(text):
    content, calls = split("hermes", text, [])
    if not calls:
        assert content == text.lstrip()
    else:
        assert not any(call in content for call in HERMES_CALLS)  # a valid block never stays in the text


def test_required_and_named_read_the_constrained_list_in_every_format():
    for mode in ("required", "named"):
        plan = ToolPlan(mode, tools=[], names=PLAN.names, function="get_weather")
        text = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
        assert split("mistral", text, [9, 30], plan) == ("", [PARIS])
    cut = ToolCallText(ToolPlan("required", tools=[], names=PLAN.names))
    assert cut.feed('[{"name": "get_weather", "argu') == []
    assert cut.finish() == ['[{"name": "get_weather", "argu'] and cut.calls == []  # cut before a call: content


def test_a_calls_arguments_are_closed_to_undeclared_ones():
    nested = {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {}}}, "c": {}}}
    assert closed(nested) == {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {}}, "additionalProperties": False}, "c": {}},
        "additionalProperties": False,
    }
    open_one = {"type": "object", "properties": {}, "additionalProperties": True}
    assert closed(open_one) == open_one

"""Tool calls as they stream: argument fragments that add up to the whole answer's calls in any
chunking (the first delta of a call names it, as OpenAI's and vLLM's streams do), and an answer
that ends at a repeated call (a forced call on a small model) without ever sending the repeat,
while the same tool with other arguments stays a parallel call."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from deployments.tools.calls import Piece, ToolCallText, compact
from deployments.tools.plan import ToolPlan
from tests.unit.tools.test_formats import ADD, PARIS, PLAN, RECORDED, read, split

REQUIRED = ToolPlan("required", tools=[], names=PLAN.names)
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def streamed_calls(pieces: list[Piece]) -> list[dict]:
    """The calls as a client adds up the deltas (OpenAI's accumulation: by index, strings joined),
    checking that only a call's first delta names it."""
    calls: list[dict] = []
    for piece in pieces:
        if isinstance(piece, str):
            continue
        if piece.index == len(calls):
            assert piece.id and piece.type == "function" and piece.function.name, piece
            calls.append({"id": piece.id, "name": piece.function.name, "arguments": piece.function.arguments})
        else:
            assert piece.index == len(calls) - 1 and piece.id is None and piece.function.name is None, piece
            calls[piece.index]["arguments"] += piece.function.arguments
    return calls


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(RECORDED), st.lists(st.integers(0, 400), max_size=12))
def test_streamed_deltas_add_up_to_the_whole_answers_calls(recorded, cuts):
    fmt, text, _, _ = recorded
    pieces, reader = read(fmt, text, cuts)
    whole = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in reader.calls]
    assert streamed_calls(pieces) == whole


def test_arguments_stream_as_the_model_writes_them():
    reader = ToolCallText(REQUIRED)
    sent = [reader.feed(t) for t in ('[{"name": "get_weather", "arguments": {', '"city": "Pa', "ris", '"}}', "]")]
    sent.append(reader.finish())
    assert [[(d.index, d.id is not None, d.function.name, d.function.arguments) for d in s] for s in sent] == [
        [(0, True, "get_weather", "{")],
        [(0, False, None, '"city": "Pa')],
        [(0, False, None, "ris")],
        [(0, False, None, '"}')],
        [],
        [],
    ]
    pythonic = ToolCallText(PLAN)
    pythonic.use("pythonic")
    fragments = [pythonic.feed(t) for t in ("[add(a=1, ", "b=2", ")", "]")]
    assert [[d.function.arguments for d in f] for f in fragments] == [['{"a": 1'], [], [', "b": 2}'], []]
    assert json.loads(pythonic.calls[0].function.arguments) == {"a": 1, "b": 2}


def test_a_call_that_repeats_an_earlier_one_ends_the_answer_unsent():
    """The 135M default, made to call with parallel calls allowed, writes the same call again and
    again: the first repeat is dropped before any of it is sent, and the reader stops."""
    pieces, reader = read("generic", f"[{CALL}, {CALL}, {CALL}, {CALL}]", list(range(0, 300, 3)), REQUIRED)
    assert reader.stopped and {d.index for d in pieces if not isinstance(d, str)} == {0}
    assert split("generic", f"[{CALL}, {CALL}, {CALL}]", [], REQUIRED) == ("", [PARIS])
    hermes = f"<tool_call>{CALL}</tool_call>\n<tool_call>{CALL}</tool_call>\n<tool_call>"
    assert read("hermes", hermes, [])[1].stopped and split("hermes", hermes, []) == ("", [PARIS])
    no_arguments = '[{"name": "add", "arguments": {}}, {"name": "add", "arguments": { }}, {"na'
    assert split("generic", no_arguments, [], REQUIRED) == ("", [("add", {})])  # the same but for JSON whitespace


def test_the_same_tool_with_other_arguments_is_a_parallel_call():
    reader = ToolCallText(REQUIRED)
    opening = f'[{CALL}, {{"name": "get_weather", "arguments": {{"city": "Pa'
    assert [d.index for d in reader.feed(opening)] == [0]
    assert reader.feed("r") == []  # may still be the first call again: held back
    released = reader.feed('k"}}]')  # it differs: sent, all it has written
    assert [(d.index, d.function.name, d.function.arguments) for d in released] == [
        (1, "get_weather", '{"city": "Park"}')
    ]
    assert not reader.stopped and reader.finish() == []
    assert [json.loads(c.function.arguments)["city"] for c in reader.calls] == ["Paris", "Park"]


def test_without_parallel_calls_the_answer_ends_after_its_first_call():
    plan = ToolPlan("auto", tools=[], names=PLAN.names, parallel=False)
    text = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n<tool_call>{"name": "get_'
    _, reader = read("hermes", text, [10, 20], plan)
    assert reader.stopped and [(c.function.name, json.loads(c.function.arguments)) for c in reader.calls] == [ADD]


def test_compact_drops_whitespace_between_tokens_only():
    assert compact('{ "a" : "x y",\n "b": [1, 2] }') == '{"a":"x y","b":[1,2]}'
    assert compact('{"a": "unfinished  str') == '{"a":"unfinished  str'

"""`PartialJson` against Python's own JSON parser: any JSON value, written with any spacing and fed
in any chunks, is read whole with its raw text, every prefix of it stays a prefix (never failed),
and text the parser rejects is text that `json.loads` rejects too."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from deployments.tools.partial_json import PartialJson

SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


def fed(text: str, cuts: list[int]) -> PartialJson:
    doc = PartialJson()
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    for a, b in itertools.pairwise(bounds):
        doc.feed(text[a:b])
        assert doc.failed is None or b > doc.failed
    doc.finish()
    return doc


@settings(max_examples=300, deadline=None)
@given(VALUES, st.sampled_from([(",", ":"), (", ", ": "), (" ,\n ", " :\t")]), st.booleans(), st.lists(st.integers()))
def test_any_json_value_in_any_chunks_is_read_whole(value, separators, ascii_only, cuts):
    text = json.dumps(value, separators=separators, ensure_ascii=ascii_only)
    doc = fed(text + " trailing", cuts)
    assert doc.done and doc.failed is None and doc.root is not None
    assert doc.raw(doc.root) == text and json.loads(doc.raw(doc.root)) == value


@settings(max_examples=300, deadline=None)
@given(VALUES, st.integers(0, 10_000))
def test_every_prefix_of_a_value_is_open_and_its_raw_text_only_grows(value, cut):
    text = json.dumps(value)
    doc = PartialJson()
    doc.feed(text[: cut % (len(text) + 1)])
    assert doc.failed is None
    if doc.root is not None:
        before = doc.raw(doc.root)
        doc.feed(text[len(doc.text) :])
        assert doc.raw(doc.root).startswith(before)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet='{}[]",:0123456789.eE+-tfrunlas \\\n', max_size=24), st.lists(st.integers(), max_size=5))
def test_what_it_rejects_is_no_json(text, cuts):
    doc = fed(text, cuts)
    if doc.failed is not None:
        try:
            json.loads(text, strict=False)
        except ValueError:
            return
        raise AssertionError(f"{text!r} rejected at {doc.failed}")
    if doc.done:
        json.loads(text[: doc.pos], strict=False)  # what it read as one value is one

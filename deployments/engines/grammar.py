"""A request's grammar (`GrammarSpec`, from `response_format`, vLLM's `structured_outputs` or a
forced tool call), shared by every engine library: as a JSON schema (`json_object` is any object,
`json_schema` the client's own schema, a 400 when it is missing or not JSON) with the JSON whitespace
allowed between tokens; or, for `structured_outputs`' `regex`, `choice` and `grammar`, as a Lark
grammar in llguidance's dialect (which both engines compile with llguidance: a GBNF grammar,
``root ::= ...``, is translated to it).
"""

from __future__ import annotations

import json
from typing import Any

from deployments.errors import InvalidRequestError
from deployments.protocol.replica import GrammarSpec

# JSON whitespace between tokens: any, but at most this many characters in a row. Unbounded (the
# library's default), a weak model can fill its whole budget with indentation and never close the
# document; llama.cpp's JSON grammars and xgrammar's `max_whitespace_cnt` bound it the same way.
# 40 leaves room for a newline and 39 columns of indentation.
JSON_WHITESPACE = r"[\x20\x0A\x0D\x09]{0,40}"
COMPACT_WHITESPACE = r"\x20?"  # `GrammarSpec.compact`: tool calls


JSON_KINDS = ("json_object", "json_schema")


def grammar_schema(spec: GrammarSpec) -> Any:
    """The JSON schema the output must satisfy."""
    if spec.kind == "json_object":
        return {"type": "object"}
    if not spec.json_schema:
        raise InvalidRequestError(f"{spec.param} json_schema needs a schema.", param=spec.param)
    try:
        return json.loads(spec.json_schema)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"{spec.param}'s JSON schema is not valid JSON: {exc}", param=spec.param) from exc


def lark_grammar(spec: GrammarSpec) -> str:
    """The Lark grammar (llguidance's dialect) of a `regex`, `choice` or `grammar` spec; a grammar
    that llguidance cannot read is a 400.
    """
    import llguidance
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        if spec.kind == "regex":
            return str(
                json.loads(llguidance.LLMatcher.grammar_from_regex(spec.pattern or ""))["grammars"][0]["lark_grammar"]
            )
        if spec.kind == "choice":
            return "start: " + " | ".join(json.dumps(choice) for choice in spec.choices or [])
        lark = str(any_to_lark(spec.pattern or ""))
    except Exception as exc:
        raise InvalidRequestError(f"Invalid {spec.kind} in {spec.param}: {exc}", param=spec.param) from exc
    if error := llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(lark), None):
        raise InvalidRequestError(f"Invalid {spec.kind} in {spec.param}: {error}", param=spec.param)
    return lark


def whitespace(spec: GrammarSpec) -> str:
    """The whitespace pattern allowed between the output's JSON tokens."""
    return COMPACT_WHITESPACE if spec.compact else JSON_WHITESPACE

"""A request's grammar (`GrammarSpec`, from `response_format` or a forced tool call) as a JSON
schema, shared by every engine library: `json_object` is any object, `json_schema` the client's own
schema (a 400 when it is missing or not JSON), and the JSON whitespace allowed between tokens."""

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


def grammar_schema(spec: GrammarSpec) -> Any:
    """The JSON schema the output must satisfy."""
    if spec.kind == "json_object":
        return {"type": "object"}
    if not spec.json_schema:
        raise InvalidRequestError("response_format json_schema needs a schema.", param="response_format")
    try:
        return json.loads(spec.json_schema)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(
            f"response_format's JSON schema is not valid JSON: {exc}", param="response_format"
        ) from exc


def whitespace(spec: GrammarSpec) -> str:
    """The whitespace pattern allowed between the output's JSON tokens."""
    return COMPACT_WHITESPACE if spec.compact else JSON_WHITESPACE

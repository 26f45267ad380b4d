"""Schemathesis fuzzes the ingress from its own OpenAPI spec, over HTTP against real Serve: valid and
invalid bodies for every operation, checked for server errors, undocumented status codes and
content types, and acceptance of invalid data. The decoder and captioner are deterministic fakes:
the fuzzing is about the ingress, and this keeps it fast."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, assume, given, settings
from schemathesis.generation.modes import GenerationMode

from tests.serve.conftest import BASE_URL, deploy, echo_with_captioner, undeploy, write_models


@pytest.fixture(scope="module")
def api_schema(serve_cluster, tmp_path_factory):
    models = write_models(tmp_path_factory.mktemp("fuzz"), echo_with_captioner(None, max_tokens=8))
    deploy(models)
    yield schemathesis.openapi.from_url(f"{BASE_URL}/openapi.json")
    undeploy("default", "vision")


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_ingress_conforms_to_its_spec(api_schema, mode):
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {op.label for op in operations} >= {
        "POST /v1/chat/completions",
        "POST /v1/completions",
        "GET /v1/models",
        "GET /v1/models/{model}",
        "GET /health",
    }
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and (operation.method.upper() != "POST" or not len(operation.body)):
            continue  # nothing to make invalid in a GET or a POST without a body (an id is any string)

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case):
            if mode is GenerationMode.POSITIVE:
                assume(not breaks_a_rule_across_fields(case.body, case.path))
            else:
                assume(not left_out_of_a_form(case))
            case.call_and_validate(timeout=30)

        check()


def left_out_of_a_form(case) -> bool:
    """A negative case that makes a form field an empty array: multipart sends that as no part at all,
    the same request as an optional field left out, which is valid."""
    return case.media_type == "multipart/form-data" and isinstance(case.body, dict) and [] in case.body.values()


def breaks_a_rule_across_fields(body: object, path: str = "") -> bool:
    """The documented 400s that depend on two fields at once, which the OpenAPI schema cannot say
    (docs/api.md, request fields): schema-valid bodies that break one are not "valid data" to accept.
    And one the generator gets wrong (below)."""
    if not isinstance(body, dict):
        return False
    choice, tools = body.get("tool_choice"), body.get("tools") or []
    names = {_tool_name(t) for t in tools if isinstance(t, dict)}
    return bool(
        ("stream_options" in body and body.get("stream_options") is not None and not body.get("stream"))
        or (body.get("top_logprobs") is not None and not body.get("logprobs"))
        or (choice not in (None, "none") and not tools)
        # The Responses API's hosted tools are set aside: a forced choice needs a function tool among them.
        or (path == "/v1/responses" and choice not in (None, "none", "auto") and not any(map(_runs_here, tools)))
        or (isinstance(choice, dict) and _tool_name(choice) is not None and _tool_name(choice) not in names)
        or (body.get("echo") and body.get("logprobs") is not None)
        or (isinstance(body.get("n"), int) and body["n"] > 8)  # server.max_n
        # /tokenize: exactly one of prompt and messages; the chat form's flags only with messages;
        # continue_final_message only with add_generation_prompt false and a final assistant turn.
        or (path == "/tokenize" and (body.get("prompt") is None) == (body.get("messages") is None))
        or (path == "/tokenize" and body.get("prompt") is not None and bool(_CHAT_ONLY & body.keys()))
        or bool(body.get("continue_final_message"))
        # vLLM's extensions: min_tokens within the length; structured_outputs with exactly one kind, not
        # beside response_format json or a forced tool call, and none the fake engine refuses.
        or _min_tokens_past_the_length(body, path)
        or _structured_outputs_refused(body)
        # Not in the body alone: whether the store holds the response a request continues (a 400 when not).
        or body.get("previous_response_id") is not None
        # Not in the body alone: whether the model's vocabulary holds the ids (the fake's grows as it meets words).
        or (path == "/detokenize" and bool(body.get("tokens")))
        # A conversation's item ids are unique (a repeated id is a 400: it would loop a client's pager).
        or (path.startswith("/v1/conversations") and _repeats_an_item_id(body.get("items")))
        # Not in the schema: the configured image limits (images.max_images_per_message 8, per request 16).
        or _too_many_images(body.get("messages"))
        # Not in the schema: a document names exactly one source (file_data, file_id or file_url), and its bytes
        # (a PDF or text behind it) are read; what cannot be read is a 400 naming it. The generator's strings
        # are never a document.
        or _names_a_document(body)
        # Not a rule across fields: near 2**63 the generator oversteps the spec's own exact bound on
        # `seed` (9223372036854775999 against `exclusiveMaximum: 9223372036854775808`), float rounding.
        or (isinstance(body.get("seed"), int) and not -(2**63) <= body["seed"] < 2**63)
    )


def _too_many_images(messages: object) -> bool:
    if not isinstance(messages, list):
        return False
    counts = [
        sum(isinstance(part, dict) and part.get("type") in ("image_url", "image") for part in content)
        for message in messages
        if isinstance(message, dict) and isinstance(content := message.get("content"), list)
    ]
    return any(count > 8 for count in counts) or sum(counts) > 16


def _repeats_an_item_id(items: object) -> bool:
    if not isinstance(items, list):
        return False
    ids = [item["id"] for item in items if isinstance(item, dict) and item.get("id") is not None]
    return len(ids) != len(set(map(str, ids)))


def _names_a_document(value: object) -> bool:
    """Anywhere in the body, a chat `file` part, a Responses `input_file` or a Messages `document` block."""
    if isinstance(value, list):
        return any(_names_a_document(item) for item in value)
    if not isinstance(value, dict):
        return False
    return value.get("type") in ("file", "input_file", "document") or any(
        _names_a_document(item) for item in value.values()
    )


_CHAT_ONLY = {"tools", "add_generation_prompt", "continue_final_message"}


def _min_tokens_past_the_length(body: dict, path: str) -> bool:
    # A JSON integer may come as 76.0 (JSON Schema's integers include whole floats), which pydantic takes.
    least = body.get("min_tokens")
    if not _a_number(least):
        return False
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if limit is None and path == "/v1/completions":
        limit = 16  # the endpoint's default max_tokens
    return _a_number(limit) and least > limit


def _a_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _structured_outputs_refused(body: dict) -> bool:
    outputs = body.get("structured_outputs")
    if not isinstance(outputs, dict):
        return False
    kinds = [k for k in ("json", "regex", "choice", "grammar") if outputs.get(k) is not None]
    kinds += ["json_object"] if outputs.get("json_object") else []
    fmt, choice = body.get("response_format"), body.get("tool_choice")
    return (
        kinds not in (["json"], ["json_object"], ["choice"])  # the fake engine refuses regex and grammar
        or not isinstance(outputs.get("json", {}), dict)  # a schema as text: the fake parses it, may refuse
        or (isinstance(fmt, dict) and fmt.get("type") != "text")
        or (bool(body.get("tools")) and (choice == "required" or isinstance(choice, dict)))
    )


def _runs_here(tool: object) -> bool:
    """A Responses tool this server runs: a function or a namespace of them (not a hosted one)."""
    return isinstance(tool, dict) and tool.get("type") in ("function", "namespace")


def _tool_name(item: dict) -> object:
    """A tool's or a named tool choice's name: chat nests it under `function`; the Responses and
    Messages APIs have it flat."""
    function = item.get("function")
    return function.get("name") if isinstance(function, dict) else item.get("name")

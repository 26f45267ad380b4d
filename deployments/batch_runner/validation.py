"""A batch's input file checked before any line runs: each line's JSON, a unique `custom_id`, `method`
POST, `url` equal to the batch's endpoint, and a body that the endpoint's own request model accepts
and that names a model served for it. The file is read streamed (`input_lines.lines`); what is kept is the
set of custom_ids (bounded by `server.batches.max_file_lines`) and the first errors.

Every failure is one line's (`errors.data[]`: `code`, `message`, `param`, `line`), never the check's:
a line that is not JSON (nested too deeply to parse, a number too long) is `invalid_json_line`, one
longer than the request-body cap (`server.max_body_bytes`, read as `LongLine`, never held whole)
`line_too_large`, and any other exception while checking a line `invalid_request`. The runner reads
lines with the same `input_lines.read_line` and the same cap, so a line that fails only while running (a file
validated by an older version, a cap lowered since) fails alone, in the error file.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from deployments.batch_runner.input_lines import LongLine, body_of, custom_id_of, parse_line
from deployments.config.lora import named_adapter
from deployments.errors import validation_message
from deployments.protocol.openai.batches import BATCH_ENDPOINTS, BatchError

logger = logging.getLogger("ray.serve")


@dataclass
class Validated:
    """What checking a file found: its request count, the model of its first line, its first errors."""

    total: int = 0
    model: str | None = None
    errors: list[BatchError] = field(default_factory=list)


@dataclass(frozen=True)
class ServedNames:
    """The models a batch line may name: chat models (chat, completions, responses), with their LoRA
    adapters named as a request names them (`adapters`: each chat model's listed ones; `dynamic`: those
    with a `dynamic_path`), and embedding models.
    """

    chat: frozenset[str]
    embedding: frozenset[str]
    adapters: Mapping[str, Collection[str]] = field(default_factory=dict)
    dynamic: frozenset[str] = frozenset()

    def for_endpoint(self, endpoint: str) -> frozenset[str]:
        return self.embedding if BATCH_ENDPOINTS[endpoint].embedding else self.chat

    def serves(self, endpoint: str, model: object) -> bool:
        if not isinstance(model, str):
            return False
        if BATCH_ENDPOINTS[endpoint].embedding:
            return model in self.embedding
        taken = self.chat | self.embedding
        return model in self.chat or named_adapter(model, self.adapters, self.dynamic, taken) is not None


def check_line(raw: bytes | LongLine, endpoint: str, served: ServedNames) -> tuple[str, dict[str, Any]] | BatchError:
    """A line's custom_id and body, or why it cannot run (its `line` left for the caller to set)."""
    line = parse_line(raw)
    if isinstance(line, BatchError):
        return line
    custom_id = custom_id_of(line)
    if isinstance(custom_id, BatchError):
        return custom_id
    if line.get("method") != "POST":
        return BatchError(code="invalid_method", message="method must be POST.", param="method")
    if line.get("url") != endpoint:
        return BatchError(
            code="mismatched_endpoint",
            message=f"url {line.get('url')!r} does not match the batch's endpoint {endpoint!r}.",
            param="url",
        )
    body = body_of(line)
    if isinstance(body, BatchError):
        return body
    if body.get("stream"):
        return BatchError(code="invalid_request", message="stream is not supported in a batch.", param="body.stream")
    try:
        BATCH_ENDPOINTS[endpoint].request.model_validate(body)
    except ValidationError as exc:
        message, param = validation_message([dict(e) for e in exc.errors()])
        return BatchError(code="invalid_request", message=message, param=f"body.{param}" if param else "body")
    if not served.serves(endpoint, body.get("model")):
        names = served.for_endpoint(endpoint)
        return BatchError(
            code="model_not_found",
            message=f"The model {body.get('model')!r} is not served for {endpoint} "
            f"(served: {', '.join(sorted(names)) or 'none'}).",
            param="body.model",
        )
    return custom_id, body


def validate(
    lines: Iterable[tuple[int, bytes | LongLine]], endpoint: str, served: ServedNames, max_lines: int, max_errors: int
) -> Validated:
    """Check every line (`lines`: numbered, as `input_lines.lines` reads them, with its cap)."""
    found = Validated()
    seen: set[str] = set()

    def fail(error: BatchError, number: int | None) -> None:
        if len(found.errors) < max_errors:
            found.errors.append(error.model_copy(update={"line": number}))

    for number, raw in lines:
        found.total += 1
        try:
            checked = check_line(raw, endpoint, served)
        except Exception as exc:  # a line fails alone, never the batch's check
            logger.warning("batch line %d could not be checked", number, exc_info=True)
            checked = BatchError(
                code="invalid_request", message=f"This line could not be checked ({type(exc).__name__})."
            )
        if isinstance(checked, BatchError):
            fail(checked, number)
            continue
        custom_id, body = checked
        if custom_id in seen:
            fail(
                BatchError(
                    code="duplicate_custom_id",
                    message=f"The custom_id {custom_id!r} is used by an earlier line.",
                    param="custom_id",
                ),
                number,
            )
        seen.add(custom_id)
        found.model = found.model or body.get("model")
    if found.total == 0:
        fail(BatchError(code="empty_file", message="The input file has no requests."), None)
    elif found.total > max_lines:
        fail(
            BatchError(
                code="too_many_lines",
                message=f"The input file has {found.total} requests; at most {max_lines} are allowed.",
            ),
            None,
        )
    return found

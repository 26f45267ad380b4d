"""Every error the service raises on purpose, and the one mapper to OpenAI's error shape.

Hierarchy::

    MMServeError
    ├── ConfigError                 models.yaml / builder args are wrong (raised at build time)
    └── ServiceError                a request failed; carries HTTP status and OpenAI fields
        ├── InvalidRequestError     400 invalid_request_error
        │   ├── InvalidImageError       400, param points at the image part
        │   ├── InvalidDocumentError    400, a document (PDF or text) refused: the message names it
        │   ├── VisionDisabledError     400, the model takes no images
        │   ├── ContextLengthError      400, code context_length_exceeded
        │   └── PreviousResponseNotFound    400, code previous_response_not_found (unknown or evicted)
        ├── AuthenticationError     401, code invalid_api_key
        ├── ModelNotFoundError      404, code model_not_found
        ├── ResponseNotFoundError   404, code response_not_found (a stored response: unknown or evicted)
        ├── ObjectNotFoundError     404, code not_found (a file or batch: unknown, deleted, another key's)
        ├── RequestTimeoutError     408, code request_timeout (the request's deadline passed)
        ├── PayloadTooLargeError    413, code request_too_large
        └── UnavailableError        503 service_unavailable, with Retry-After
            ├── CaptionerUnavailable    the vision captioner cannot caption now
            │   └── CaptionerTimeout        it did not answer within proxy_vision.timeout_s
            ├── DecoderUnavailable      the primary decoder cannot generate now
            ├── EmbedderUnavailable     an embedding model cannot embed now (loading, failed)
            └── OverloadedError         a deployment's queue is full (Serve's max_queued_requests)

`to_openai_error` turns any exception (ours, a pydantic validation error, one re-raised through a
Ray handle, Serve's back-pressure and dead-replica errors, or a bug) into ``(status, body,
headers)``. Bugs become a generic 500 whose message names the request id; the details go to the
logs only. `as_anthropic` renders the same mapping's body in Anthropic's shape (for /v1/messages):
its error type by the status, the same message, except a prompt longer than the context, which says
it as Anthropic does ("prompt is too long: N tokens > M maximum", the words Claude Code reads to
offer compaction).
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import ValidationError
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError


class MMServeError(Exception):
    """Base of every deliberate error in this package."""


class ConfigError(MMServeError):
    """The configuration is invalid. The message names the file and the field."""


class ServiceError(MMServeError):
    """A request-level error with its OpenAI error fields."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only fields must survive pickling across Ray handles.
        return (_rebuild, (type(self), self.message, self.param))


def _rebuild(cls: type[ServiceError], message: str, param: str | None) -> ServiceError:
    return cls(message, param=param)


class InvalidRequestError(ServiceError):
    """The request cannot be served as it is (400); the message says what to change."""

    status = 400
    type = "invalid_request_error"


class InvalidImageError(InvalidRequestError):
    """An image part is refused (400): unreadable, too large or from a source not allowed."""

    code = "invalid_image"


class InvalidDocumentError(InvalidRequestError):
    """A document (PDF or text) is refused (400); the message names it."""

    code = "invalid_document"


class VisionDisabledError(InvalidRequestError):
    """The request has images and the model takes none (400)."""

    code = "vision_not_supported"


class ContextLengthError(InvalidRequestError):
    """The prompt does not fit the model's context (400)."""

    code = "context_length_exceeded"

    @property
    def sizes(self) -> tuple[int, int] | None:
        """`(prompt tokens, the model's context)` as the message gives them (it is all that crosses a
        Ray handle), None when it does not.
        """
        return context_sizes(self.message)


# What `engines.context.Limits.completion` says: "This model's context is M tokens; the prompt has N".
_CONTEXT_SIZES = re.compile(r"context is (\d+) tokens; the prompt has (\d+)")


def context_sizes(message: str) -> tuple[int, int] | None:
    """`(prompt tokens, context)` of a context-length error's message, None when it names neither."""
    found = _CONTEXT_SIZES.search(message)
    return (int(found[2]), int(found[1])) if found else None


class PreviousResponseNotFound(InvalidRequestError):
    """`previous_response_id` names a response that is unknown or evicted (400)."""

    code = "previous_response_not_found"


class AuthenticationError(ServiceError):
    """No accepted API key came with the request (401)."""

    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class RequestTimeoutError(ServiceError):
    """The request's deadline passed before its answer was complete (408)."""

    status = 408
    type = "timeout_error"
    code = "request_timeout"


class PayloadTooLargeError(ServiceError):
    """The request's body is over its cap (413)."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class ModelNotFoundError(ServiceError):
    """The request names a model that is not served, or not to this key (404)."""

    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class ResponseNotFoundError(ServiceError):
    """A stored response that is unknown or evicted (404)."""

    status = 404
    type = "invalid_request_error"
    code = "response_not_found"


class ObjectNotFoundError(ServiceError):
    """A file or batch that is unknown, deleted or another key's (404)."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


class RateLimitError(ServiceError):
    """Over one of the key's limits (`ingress.limits`): OpenAI's 429, its `type` the limit's kind
    (`requests`, `tokens`), as OpenAI's rate-limit errors have it.
    """

    status = 429
    type = "requests"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, param: str | None = None, limit: str = "requests") -> None:
        super().__init__(message, param=param)
        self.type = "tokens" if limit in ("tokens", "too_large") else "requests"


class UnavailableError(ServiceError):
    """The service cannot answer now (503); `Retry-After` says when to try again."""

    status = 503
    type = "service_unavailable"
    code = "service_unavailable"
    retry_after_s = 10


class CaptionerUnavailable(UnavailableError):
    """The vision captioner cannot caption now (503 under `on_failure: reject`)."""

    code = "captioner_unavailable"


class CaptionerTimeout(CaptionerUnavailable):
    """Same status and code as its parent (a 503 under `on_failure: reject`); its own class so that a
    degraded response can say the captioner was slow rather than down.
    """


class DecoderUnavailable(UnavailableError):
    """A served model's decoder cannot generate now: loading, failed or restarting (503)."""

    code = "decoder_unavailable"


class EmbedderUnavailable(UnavailableError):
    """An embedding model cannot embed now: loading or failed (503)."""

    code = "embedder_unavailable"


class OverloadedError(UnavailableError):
    """A deployment's queue is full (Serve's `max_queued_requests`): 503 with a short `Retry-After`."""

    code = "overloaded"
    retry_after_s = 1


def known_errors() -> list[tuple[int, str]]:
    """`(status, code or type)` of every `ServiceError` class, as the access log labels a rejection."""
    pairs: list[tuple[int, str]] = []
    classes: list[type[ServiceError]] = [ServiceError]
    while classes:
        cls = classes.pop(0)
        if (pair := (cls.status, cls.code or cls.type)) not in pairs:
            pairs.append(pair)
        classes.extend(cls.__subclasses__())
    return pairs


def from_serve(exc: BaseException) -> BaseException:
    """Serve's errors for a call through a handle, as ours: a full queue is `OverloadedError`
    (honouring the deployment's ``backpressure_config``), a replica that died or cannot be reached
    is `UnavailableError`. Anything else is returned unchanged.
    """
    exc = unwrap(exc)
    if isinstance(exc, BackPressureError):
        error = OverloadedError("The service is at capacity (a deployment's queue is full); retry shortly.")
        if exc.retry_after_s:
            error.retry_after_s = max(1, math.ceil(exc.retry_after_s))
        return error
    if isinstance(exc, RayActorError | DeploymentUnavailableError):
        return UnavailableError("A model replica stopped or is restarting; retry shortly.")
    return exc


def error_body(message: str, type_: str, *, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error body, ``{"error": {...}}``, from its fields."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def unwrap(exc: BaseException) -> BaseException:
    """Ray re-raises a replica's exception as RayTaskError; its ``cause`` is the original."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def validation_param(loc: tuple[Any, ...]) -> str | None:
    """`("body", "messages", 0, "content")` -> `"messages[0].content"` (OpenAI's param style)."""
    parts: list[str] = []
    for item in loc:
        if item in ("body", "query", "path") and not parts:
            continue
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or None


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """First pydantic/FastAPI error as ``(message, param)``; tagged-union noise trimmed from loc."""
    if not errors:
        return "Invalid request body.", None
    # A union reports one error per branch; the deepest one is the branch the client meant.
    first = max(errors, key=lambda e: len(e.get("loc", ())))
    loc = _strip_union_tags(tuple(first.get("loc", ())))
    if first.get("type") in ("union_tag_invalid", "union_tag_not_found"):  # loc stops at the union: name its tag field
        tag = str(first.get("ctx", {}).get("discriminator", "")).strip("'")
        loc += ("type" if tag.endswith("()") else tag,)  # a function's tag (`_item_type()`): the items' `type`
    param = validation_param(loc)
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "json_invalid":
        return "Request body is not valid JSON.", None
    return (f"{param}: {msg}" if param else msg), param


_UNION_TAGS = {
    *("user", "system", "developer", "assistant", "tool", "text", "image_url", "json_object", "json_schema"),
    # The Responses API's items (its input, a conversation's) and their parts.
    *("message", "function_call", "function_call_output", "compaction"),
    *("input_text", "input_image", "input_file", "output_text", "refusal"),
}


def _strip_union_tags(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """Drop what unions add to a loc: the tag after a list index (`0, "user"`) and branch names
    (`"list[...]"`, `"str"`), keeping real field names such as `image_url`.
    """
    out: list[Any] = []
    for before, prev, part in zip((None, None, *loc), (None, *loc), loc, strict=False):
        if isinstance(part, str):
            plain_list = isinstance(before, str) and before.startswith("list[") and "tagged-union" not in before
            if isinstance(prev, int) and part in _UNION_TAGS and not plain_list:  # no tag in a list[TextPart]
                continue
            if prev == "response_format" and part in _UNION_TAGS:  # a tagged union that is no list item
                continue
            if part.startswith(("list[", "function-", "tagged-union", "constrained-")) or part == "str":
                continue
        out.append(part)
    return tuple(out)


def to_openai_error(exc: BaseException, request_id: str) -> tuple[int, dict, dict[str, str]]:
    """Map any exception to ``(status, OpenAI error body, extra headers)``."""
    exc = from_serve(exc)
    if isinstance(exc, ServiceError):
        headers = {}
        if isinstance(exc, UnavailableError):
            headers["Retry-After"] = str(exc.retry_after_s)
        return exc.status, error_body(exc.message, exc.type, param=exc.param, code=exc.code), headers
    if isinstance(exc, ValidationError):
        message, param = validation_message(exc.errors())  # type: ignore[arg-type]
        return 400, error_body(message, "invalid_request_error", param=param), {}
    message = f"Internal server error (request id {request_id}); see the service logs."
    return 500, error_body(message, "server_error"), {}


ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def as_anthropic(status: int, body: dict) -> dict:
    """An OpenAI error body (`to_openai_error`'s, the guard's) in Anthropic's shape:
    ``{"type": "error", "error": {"type", "message"}}``, the type Anthropic gives the status.
    """
    fallback = "api_error" if status >= 500 else "invalid_request_error"
    message = body["error"]["message"]
    sizes = context_sizes(message) if body["error"].get("code") == ContextLengthError.code else None
    if sizes is not None and sizes[0] >= sizes[1]:  # Anthropic's words, which its clients match
        message = f"prompt is too long: {sizes[0]} tokens > {sizes[1]} maximum"
    return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(status, fallback), "message": message}}

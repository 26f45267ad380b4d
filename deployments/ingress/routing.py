"""What the routes of every API share (each API's `routes.py` attaches its routes with them): the
errors it declares in the OpenAPI schema (`ERRORS`, `streamed`), the request's id (Serve's), its
access-log record with the model it names (`recorded`), who makes it (`caller`, the owner of what
it stores), and how a batch line calls an API that a batch may name (`BatchLine`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from ray.serve.context import _get_serve_request_context
from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.types import Scope

from deployments.errors import (
    AuthenticationError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    RequestTimeoutError,
)
from deployments.ingress.served_models import ServedModels
from deployments.monitoring.access_log import RequestRecord, record_of
from deployments.protocol.openai.common import ErrorResponse
from deployments.state.owners import Caller, caller_of

Responses = dict[int | str, dict[str, Any]]

ERRORS: Responses = {
    error.status: {"model": ErrorResponse, "description": error.__name__}
    for error in (
        InvalidRequestError,
        AuthenticationError,
        ModelNotFoundError,
        RequestTimeoutError,
        PayloadTooLargeError,
        OverloadedError,
    )
}
"""The errors every route may answer, in OpenAI's shape."""

NOT_FOUND: Responses = {401: ERRORS[401], 404: ERRORS[404]}
"""The errors of a route that reads something stored."""


def streamed(description: str, errors: Responses = ERRORS) -> Responses:
    """A route that answers a JSON body or, when the request streams, server-sent events."""
    return {200: {"content": {"text/event-stream": {}}, "description": description}, **errors}


def request_id(scope: Scope) -> str:
    """Serve's request id: in every Serve log line of the request and in the x-request-id header.
    Serve keeps it in its request context (private API: the one place this package reads it).
    """
    rid = _get_serve_request_context().request_id or Headers(scope=scope).get("x-request-id", "")
    return rid or "unknown"


def recorded(request: Request, model: str) -> RequestRecord:
    """The request's access-log record, with the model its body names and the caller's key digest."""
    record = record_of(request.state)
    record.model = model
    record.key_digest = caller(request).key_digest  # who may read the /v1/files a document names
    return record


def caller(connection: HTTPConnection, rid: str | None = None) -> Caller:
    """Who makes the request (or the WebSocket turn `rid`): the owner of what it stores."""
    return caller_of(connection.state, rid or request_id(connection.scope))


@dataclass(frozen=True)
class BatchLine:
    """How a batch line calls an API, declared by the API's `routes.py` as `BATCH_LINE` beside the
    route it stands for (`ingress/batches/endpoints.py` gathers them): the route's `path`, and
    `answer`: the body of the line's 200 for its request (checked by the endpoint's request model in
    `protocol/openai/batches.py`), through the same service as the route (no HTTP hop).
    """

    path: str
    answer: Callable[[ServedModels, Any, RequestRecord], Awaitable[Any]]

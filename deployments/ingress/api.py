"""The ingress's FastAPI app, built per replica by `build_api` from the served models
(`served_models.ServedModels`) and the guard's settings: each API's routes (a folder per API under
`apis/`: its `routes.py` and `service.py`; its wire in `protocol/`) mounted by one line each; no setting is
looked up through Serve. Errors leave in OpenAI's shape, through the one mapper in `errors`, or on
Anthropic's routes (/v1/messages) in Anthropic's rendering of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from deployments.errors import ServiceError, as_anthropic, error_body, known_errors, to_openai_error, validation_message
from deployments.ingress.apis.batches import routes as batches
from deployments.ingress.apis.chat import routes as chat
from deployments.ingress.apis.completions import routes as completions
from deployments.ingress.apis.conversations import routes as conversations_routes
from deployments.ingress.apis.embeddings import routes as embeddings
from deployments.ingress.apis.files import routes as files
from deployments.ingress.apis.messages import routes as messages
from deployments.ingress.apis.models import routes as models
from deployments.ingress.apis.responses import routes as responses
from deployments.ingress.apis.responses.store import ResponseStorePort
from deployments.ingress.apis.tokenize import routes as tokenize
from deployments.ingress.guard import GuardSettings, RequestGuard, anthropic_route
from deployments.ingress.limits.limiter import KeyLimiter, Limiter
from deployments.ingress.routing import request_id
from deployments.ingress.served_models import ServedModels
from deployments.monitoring.access_log import AccessLog, record_of
from deployments.monitoring.metrics import Recorder
from deployments.state.batches import BatchStore
from deployments.state.conversations import ConversationStore


def _openapi_without_422(api: FastAPI) -> None:
    """FastAPI's schema without its 422: validation errors are 400s here, like OpenAI's."""

    def openapi() -> dict[str, Any]:
        if api.openapi_schema is None:
            schema = get_openapi(title=api.title, version=api.version, summary=api.summary, routes=api.routes)
            for path in schema["paths"].values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            api.openapi_schema = schema
        return api.openapi_schema

    api.openapi = openapi  # type: ignore[method-assign]


def _error(request: Request, status: int, body: dict, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """An error body (OpenAI's shape) as the request's API shapes it."""
    if anthropic_route(request.scope):
        # The access log and metrics name the error as on every route (its OpenAI code), whatever its shape.
        record_of(request.state).error = body["error"]["code"] or body["error"]["type"]
        body = as_anthropic(status, body)
    return JSONResponse(body, status_code=status, headers=headers)


def _error_handlers(api: FastAPI) -> None:
    @api.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(list(exc.errors()))
        if isinstance(exc.body, dict) and isinstance(exc.body.get("model"), str):
            record_of(request.state).model = exc.body["model"][:200]  # for the access line
        return _error(request, 400, error_body(message, "invalid_request_error", param=param))

    @api.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Routing and body-parsing errors (404, 405, an unparsable body) in the API's shape too."""
        error_type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        body = error_body(str(exc.detail), error_type, code="not_found" if exc.status_code == 404 else None)
        return _error(request, exc.status_code, body, exc.headers)

    @api.exception_handler(ServiceError)
    @api.exception_handler(Exception)
    async def _openai_error(request: Request, exc: Exception) -> JSONResponse:
        # For bugs (Exception), Starlette re-raises after this response, so Serve logs the traceback.
        status, body, headers = to_openai_error(exc, request_id(request.scope))
        return _error(request, status, body, headers)


def build_api(
    served: ServedModels,
    guard: GuardSettings,
    metrics: Recorder,
    store: ResponseStorePort | None = None,
    batch_service: BatchStore | None = None,
    wake_runner: Callable[[], None] = lambda: None,
    limiter: Limiter | None = None,
    conversations: ConversationStore | None = None,
) -> FastAPI:
    """The routes; a request goes to the served model its `model` names. Every counter and gauge of
    the ingress is exported at 0 from here on, for each served model and known label value.
    `store`: the store of /v1/responses (None: no response is kept); `batch_service`: the files and
    batches of /v1/files and /v1/batches (None: not served), `wake_runner` tells their runner to look;
    `limiter`: the API keys' limits (None: no limits file); `conversations`: the Conversations API's
    store (None: not served).
    """
    api = FastAPI(title="mmserve", summary="OpenAI-compatible multimodal chat on Ray Serve")
    _openapi_without_422(api)
    _error_handlers(api)
    api.add_middleware(KeyLimiter, limiter=limiter)  # the keys' limits: on the key and body the guard has
    api.add_middleware(RequestGuard, settings=guard)  # API keys and the body cap, before any route
    # Outermost (added last): its line and metrics cover the guard's rejections too.
    api.add_middleware(AccessLog, metrics=metrics, request_id=request_id, routes=api.router.routes, models=served.names)

    models.attach(api, served)
    chat.attach(api, served)
    completions.attach(api, served)
    embeddings.attach(api, served)
    messages.attach(api, served)
    responses.attach(api, served, store, guard.max_body_bytes, limiter, conversations)
    tokenize.attach(api, served)
    files.attach(api, batch_service.files if batch_service else None)
    batches.attach(api, batch_service, wake_runner)
    conversations_routes.attach(api, conversations)

    metrics.export_zeros(
        served.names,
        {
            "http_requests": [{"route": route.path, "status": "200"} for route in api.routes if hasattr(route, "path")],
            "requests_rejected": [{"status": str(status), "reason": reason} for status, reason in known_errors()],
        },
    )
    return api

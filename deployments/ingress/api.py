"""The ingress's FastAPI app, built per replica by `build_api` from the served models
(`served_models.ServedModels`) and the guard's settings: the routes stay thin (an endpoint's route
hands its body to its service in `endpoints/`, over the model's answer core, and sends the
`Reply`), and no setting is looked up through Serve. Errors leave in OpenAI's shape, through the
one mapper in `errors`, or on Anthropic's routes (/v1/messages) in Anthropic's rendering of it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from fastapi import FastAPI, Query, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, StreamingResponse
from ray.serve.context import _get_serve_request_context
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

from deployments.errors import (
    AuthenticationError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    RequestTimeoutError,
    ServiceError,
    as_anthropic,
    error_body,
    known_errors,
    to_openai_error,
    validation_message,
)
from deployments.ingress.answer.reply import Reply
from deployments.ingress.endpoints.chat import ChatService
from deployments.ingress.endpoints.completions import CompletionService
from deployments.ingress.endpoints.embeddings import EmbeddingService
from deployments.ingress.endpoints.messages import MessagesService
from deployments.ingress.endpoints.responses import ResponseService
from deployments.ingress.endpoints.tokenize import TokenizeService
from deployments.ingress.guard import GuardSettings, RequestGuard, anthropic_route
from deployments.ingress.owners import caller_of
from deployments.ingress.responses.socket import ResponseSocket, connection_id
from deployments.ingress.responses.store import ConnectionCache, ResponseStorePort, delete_entry, stored_entry
from deployments.ingress.served_models import ServedModels
from deployments.monitoring.access_log import AccessLog, RequestRecord, record_of, turn_log_of
from deployments.monitoring.metrics import Recorder
from deployments.protocol.anthropic.messages import AnthropicErrorResponse, MessagesInput, MessagesRequest, TokenCount
from deployments.protocol.openai.chat import ChatCompletionRequest
from deployments.protocol.openai.common import ErrorResponse, ModelCard, ModelList
from deployments.protocol.openai.compact import CompactedResponse, CompactRequest
from deployments.protocol.openai.completions import CompletionRequest
from deployments.protocol.openai.embeddings import EmbeddingList, EmbeddingRequest
from deployments.protocol.openai.responses import InputItemList, ResponseRequest
from deployments.protocol.openai.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)

_ERRORS: dict[int | str, dict[str, Any]] = {
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
_CHAT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "A chat.completion, or chunks when stream is true"},
    **_ERRORS,
}
_MESSAGES_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": AnthropicErrorResponse, "description": error["description"]} for status, error in _ERRORS.items()
}
_MESSAGES_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "A message, or its events when stream is true"},
    **_MESSAGES_ERRORS,
}


_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "A response, or its events when stream is true"},
    **_ERRORS,
}


def input_items(items: list[dict[str, Any]], limit: int, order: str, after: str | None) -> InputItemList:
    """A page of a stored response's input items: `order` by position (desc: newest first), after
    the item `after` names."""
    ordered = items[::-1] if order == "desc" else list(items)
    ids = [item["id"] for item in ordered]
    start = ids.index(after) + 1 if after in ids else 0
    page = ordered[start : start + limit]
    return InputItemList(
        data=page,
        first_id=page[0]["id"] if page else None,
        last_id=page[-1]["id"] if page else None,
        has_more=start + limit < len(ordered),
    )


def request_id(scope: Scope) -> str:
    """Serve's request id: in every Serve log line of the request and in the x-request-id header.
    Serve keeps it in its request context (private API: the one place this package reads it)."""
    rid = _get_serve_request_context().request_id or Headers(scope=scope).get("x-request-id", "")
    return rid or "unknown"


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


def _reply(reply: Reply) -> Any:
    if reply.events is not None:
        return StreamingResponse(reply.events, media_type="text/event-stream", headers=reply.headers)
    return JSONResponse(reply.body, headers=reply.headers)


def build_api(
    served: ServedModels, guard: GuardSettings, metrics: Recorder, responses: ResponseStorePort | None = None
) -> FastAPI:
    """The routes; a request goes to the served model its `model` names. Every counter and gauge of
    the ingress is exported at 0 from here on, for each served model and known label value.
    `responses`: the store of /v1/responses (None: no response is kept)."""
    api = FastAPI(title="mmserve", summary="OpenAI-compatible multimodal chat on Ray Serve")
    _openapi_without_422(api)
    _error_handlers(api)
    api.add_middleware(RequestGuard, settings=guard)  # API keys and the body cap, before any route
    # Outermost (added last): its line and metrics cover the guard's rejections too.
    api.add_middleware(AccessLog, metrics=metrics, request_id=request_id, routes=api.router.routes, models=served.names)

    @api.get("/v1/models", responses={401: _ERRORS[401]})
    async def models() -> ModelList:
        return served.cards

    @api.get("/v1/models/{model:path}", responses={401: _ERRORS[401], 404: _ERRORS[404]})
    async def model_card(model: str) -> ModelCard:
        return served.card(model)

    @api.get("/health", responses={503: {"description": "No decoder is ready; the body says why"}})
    async def health() -> JSONResponse:
        body, code = await served.health()
        return JSONResponse(body, status_code=code)

    @api.post("/v1/chat/completions", responses=_CHAT_RESPONSES)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        record = record_of(request.state)
        record.model = body.model
        return _reply(await ChatService(served.get(body.model).core).create(body, record))

    @api.post("/v1/completions", responses=_CHAT_RESPONSES)
    async def legacy_completions(body: CompletionRequest, request: Request) -> Any:
        record = record_of(request.state)
        record.model = body.model
        return _reply(await CompletionService(served.get(body.model).core).create(body, record))

    @api.post("/v1/embeddings", responses={200: {"model": EmbeddingList}, **_ERRORS})
    async def embeddings(body: EmbeddingRequest, request: Request) -> Any:
        record = record_of(request.state)
        record.model = body.model
        return JSONResponse(await EmbeddingService(served.embedder(body.model).core).create(body, record))

    @api.post("/v1/messages", responses=_MESSAGES_RESPONSES)
    async def messages(body: MessagesRequest, request: Request) -> Any:
        """Anthropic's Messages API; `anthropic-version` is accepted, whatever its value."""
        record = record_of(request.state)
        record.model = body.model
        return _reply(await MessagesService(served.get(body.model).core).create(body, record))

    @api.post("/v1/messages/count_tokens", responses=_MESSAGES_ERRORS)
    async def count_tokens(body: MessagesInput, request: Request) -> TokenCount:
        record = record_of(request.state)
        record.model = body.model
        return await MessagesService(served.get(body.model).core).count_tokens(body, record)

    @api.post("/v1/responses", responses=_RESPONSES)
    async def create_response(body: ResponseRequest, request: Request) -> Any:
        record = record_of(request.state)
        record.model = body.model
        caller = caller_of(request.state, record.request_id)
        return _reply(await ResponseService(served.get(body.model).core).create(body, record, responses, caller))

    @api.websocket("/v1/responses")
    async def response_socket(websocket: WebSocket) -> None:
        """The WebSocket mode: `response.create` turns on one connection (`responses.socket`)."""

        async def turn(body: ResponseRequest, record: RequestRecord, connection: ConnectionCache) -> Reply:
            caller = caller_of(websocket.state, record.request_id)
            return await ResponseService(served.get(body.model).core).create(
                body, record, responses, caller, connection
            )

        rid = request_id(websocket.scope)
        await ResponseSocket(
            websocket,
            turn,
            max_message_bytes=guard.max_body_bytes,
            request_id=connection_id() if rid == "unknown" else rid,
            log=turn_log_of(websocket.state),
        ).run()

    @api.post("/v1/responses/compact", responses={200: {"model": CompactedResponse}, **_ERRORS})
    async def compact_response(body: CompactRequest, request: Request) -> Any:
        record = record_of(request.state)
        record.model = body.model
        caller = caller_of(request.state, record.request_id)
        return JSONResponse(await ResponseService(served.get(body.model).core).compact(body, record, responses, caller))

    @api.get("/v1/responses/{response_id}", responses={401: _ERRORS[401], 404: _ERRORS[404]})
    async def get_response(response_id: str, request: Request) -> Any:
        caller = caller_of(request.state, request_id(request.scope))
        return JSONResponse((await stored_entry(responses, response_id, caller))["response"])

    @api.delete("/v1/responses/{response_id}", responses={401: _ERRORS[401], 404: _ERRORS[404]})
    async def delete_response(response_id: str, request: Request) -> Any:
        await delete_entry(responses, response_id, caller_of(request.state, request_id(request.scope)))
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    @api.get("/v1/responses/{response_id}/input_items", responses={401: _ERRORS[401], 404: _ERRORS[404]})
    async def response_input_items(
        response_id: str,
        request: Request,
        limit: int = Query(20, ge=1, le=100),
        order: Literal["asc", "desc"] = "desc",
        after: str | None = None,
    ) -> InputItemList:
        caller = caller_of(request.state, request_id(request.scope))
        return input_items((await stored_entry(responses, response_id, caller))["input"], limit, order, after)

    @api.post("/tokenize", responses=_ERRORS)
    async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
        """vLLM's /tokenize: a prompt's or a chat's tokens, as the model's decoder prompts with them."""
        model = served.get(body.model or served.names[0])
        record = record_of(request.state)
        record.model = model.card.id
        return await TokenizeService(model.core).tokenize(body, record)

    @api.post("/detokenize", responses=_ERRORS)
    async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
        """vLLM's /detokenize: token ids as the model's text."""
        model = served.get(body.model or served.names[0])
        record_of(request.state).model = model.card.id
        return await TokenizeService(model.core).detokenize(body)

    metrics.export_zeros(
        served.names,
        {
            "http_requests": [{"route": route.path, "status": "200"} for route in api.routes if hasattr(route, "path")],
            "requests_rejected": [{"status": str(status), "reason": reason} for status, reason in known_errors()],
        },
    )
    return api

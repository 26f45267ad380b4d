"""Ingress: the OpenAI-compatible HTTP router (CPU). Validates, rewrites images to captions
(proxy vision), calls the decoder through its handle, and speaks OpenAI on the wire, errors
included."""

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel
from ray import serve
from ray.serve.context import _get_serve_request_context
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from starlette.exceptions import HTTPException as StarletteHTTPException

from deployments.config import ImageInputConfig, ServerConfig, VisionProxyConfig
from deployments.errors import (
    AuthenticationError,
    CaptionerUnavailable,
    DecoderUnavailable,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    RequestTimeoutError,
    ServiceError,
    VisionDisabledError,
    error_body,
    from_serve,
    to_openai_error,
    unwrap,
    validation_message,
)
from deployments.ingress.guard import GuardSettings, RequestGuard
from deployments.ingress.serve_view import SERVING, deployment_status
from deployments.ingress.vision.client import CaptionerClient
from deployments.ingress.vision.collect import UNDESCRIBED, collect_images, count_images, rewrite
from deployments.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    Choice,
    ChunkChoice,
    ComponentStatus,
    Delta,
    ErrorResponse,
    FinishReason,
    GenerateChunk,
    GenerateRequest,
    ModelCard,
    ModelList,
    ResponseMessage,
    TextMessage,
    Usage,
)

logger = logging.getLogger("ray.serve")

DEGRADED_HEADER = "X-Vision-Degraded"
DECODER_STATUS_TIMEOUT_S = 5.0


class IngressConfig(BaseModel):
    model_name: str
    vision: VisionProxyConfig | None = None
    captioner_app: str = "vision"
    images: ImageInputConfig = ImageInputConfig()
    server: ServerConfig = ServerConfig()


def _request_id(request: Request | None = None) -> str:
    """Serve's request id: in every Serve log line of the request and in the x-request-id header."""
    rid = _get_serve_request_context().request_id
    if not rid and request is not None:
        rid = request.headers.get("x-request-id", "")
    return rid or "unknown"


api = FastAPI(title="mmserve", summary="OpenAI-compatible multimodal chat on Ray Serve")
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


def _openapi() -> dict[str, Any]:
    """FastAPI's schema without its 422: validation errors are 400s here, like OpenAI's."""
    if api.openapi_schema is None:
        schema = get_openapi(title=api.title, version=api.version, summary=api.summary, routes=api.routes)
        for path in schema["paths"].values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        api.openapi_schema = schema
    return api.openapi_schema


api.openapi = _openapi  # type: ignore[method-assign]
# API keys and the body cap; the settings are those of the Ingress replica serving the request.
api.add_middleware(RequestGuard, settings=lambda: serve.get_replica_context().servable_object.guard)  # type: ignore[attr-defined]


@api.exception_handler(RequestValidationError)
async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = validation_message(list(exc.errors()))
    return JSONResponse(error_body(message, "invalid_request_error", param=param), status_code=400)


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Routing and body-parsing errors (404, 405, an unparsable body) in OpenAI's shape too."""
    error_type = "invalid_request_error" if exc.status_code < 500 else "server_error"
    body = error_body(str(exc.detail), error_type, code="not_found" if exc.status_code == 404 else None)
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


@api.exception_handler(ServiceError)
@api.exception_handler(Exception)
async def _openai_error(request: Request, exc: Exception) -> JSONResponse:
    # For bugs (Exception), Starlette re-raises after this response, so Serve logs the traceback.
    status, body, headers = to_openai_error(exc, _request_id(request))
    return JSONResponse(body, status_code=status, headers=headers)


@serve.deployment(
    name="Ingress",
    max_ongoing_requests=256,
    max_queued_requests=512,  # beyond: Serve's proxy answers 503 with Retry-After
    backpressure_config={"retry_after_s": 2},
)
@serve.ingress(api)
class Ingress:
    def __init__(self, config: IngressConfig, decoder: DeploymentHandle) -> None:
        self._config = config
        self._decoder = decoder
        self._captioner = CaptionerClient(config.captioner_app, config.vision) if config.vision else None
        self._created = int(time.time())
        self.guard = GuardSettings.from_config(config.server)
        logger.info(
            "ingress for %r: %s, body cap %d bytes, request deadline %gs",
            config.model_name,
            f"{len(self.guard.keys)} API key(s) required" if self.guard.keys else "no API keys (open)",
            config.server.max_body_bytes,
            config.server.request_timeout_s,
        )

    # ------------------------------------------------------------------ routes

    @api.get("/v1/models", responses={401: _ERRORS[401]})
    async def models(self) -> ModelList:
        return ModelList(data=[ModelCard(id=self._config.model_name, created=self._created)])

    @api.get("/health", responses={503: {"description": "The decoder is not ready; the body says why"}})
    async def health(self) -> JSONResponse:
        decoder = await self._decoder_status()
        components: dict[str, Any] = {"decoder": decoder.model_dump()}
        ready = [decoder.ready]
        if self._captioner is not None:
            captioner = await self._captioner.status()
            components["captioner"] = {**captioner.model_dump(), "cache": self._captioner.cache.describe()}
            ready.append(captioner.ready)
        overall = "ok" if all(ready) else ("degraded" if decoder.ready else "unavailable")
        return JSONResponse({"status": overall, "components": components}, status_code=200 if decoder.ready else 503)

    @api.post("/v1/chat/completions", responses=_CHAT_RESPONSES)
    async def chat_completions(self, body: ChatCompletionRequest) -> Any:
        rid = _request_id()
        if body.model != self._config.model_name:
            raise ModelNotFoundError(
                f"The model {body.model!r} does not exist. Available: {self._config.model_name!r}.", param="model"
            )
        deadline = asyncio.get_running_loop().time() + self._config.server.request_timeout_s
        timeout = asyncio.timeout_at(deadline)
        try:
            async with timeout:
                messages, degraded = await self._text_messages(body.messages)
        except TimeoutError:
            if timeout.expired():
                raise self._timed_out() from None
            raise
        generate = GenerateRequest(
            messages=messages,
            max_tokens=body.completion_limit,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            frequency_penalty=body.frequency_penalty,
            presence_penalty=body.presence_penalty,
            stop=body.stop_sequences,
            seed=body.seed,
        )
        headers = {DEGRADED_HEADER: "captioner-unavailable"} if degraded else {}
        stream: DeploymentResponseGenerator = self._decoder.options(stream=True).generate.remote(generate)  # type: ignore[assignment]
        first = await self._next(stream, deadline)  # errors before the first byte keep their status
        completion_id = f"chatcmpl-{rid}"
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            events = self._sse(first, stream, deadline, completion_id, include_usage, rid)
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        return JSONResponse(await self._collect(first, stream, deadline, completion_id), headers=headers)

    # ------------------------------------------------------------------ helpers

    async def _decoder_status(self) -> ComponentStatus:
        try:
            return await asyncio.wait_for(self._decoder.status.remote(), DECODER_STATUS_TIMEOUT_S)
        except Exception as exc:
            cause = unwrap(exc)
            if not isinstance(cause, TimeoutError | BackPressureError):
                return ComponentStatus(
                    ready=False, reason=f"decoder not reachable: {type(cause).__name__}: {cause}"[:500]
                )
        # Every replica is busy generating: the status call waits behind generation. Serve's own
        # health checks (which fail when the engine does) still say whether the decoder works.
        decoder = self._decoder
        status, words = await asyncio.to_thread(deployment_status, decoder.app_name, decoder.deployment_name)
        if status not in SERVING:
            return ComponentStatus(ready=False, model=self._config.model_name, reason=words)
        busy = f"no status answer within {DECODER_STATUS_TIMEOUT_S:g}s (replicas busy); {words}"
        return ComponentStatus(ready=True, model=self._config.model_name, details={"busy": busy})

    async def _text_messages(self, messages: list[ChatMessage]) -> tuple[list[TextMessage], str | None]:
        """Proxy vision: captions in place of images. Returns the degradation reason, if any."""
        if not count_images(messages):
            return rewrite(messages, []), None
        if self._captioner is None or self._config.vision is None:
            raise VisionDisabledError(
                f"Model {self._config.model_name!r} does not accept images (vision is disabled).", param="messages"
            )
        images = await collect_images(messages, self._config.images)
        try:
            captions = await self._captioner.caption(images)
        except CaptionerUnavailable as exc:
            if self._config.vision.on_failure == "reject":
                raise
            logger.warning("answering without image descriptions: %s", exc.message)
            return rewrite(messages, [UNDESCRIBED.format(reason="captioner unavailable")] * len(images)), exc.message
        return rewrite(messages, captions), None

    def _timed_out(self) -> RequestTimeoutError:
        limit = self._config.server.request_timeout_s
        return RequestTimeoutError(
            f"The request did not finish within {limit:g} s (server.request_timeout_s); its generation was cancelled."
        )

    async def _next(self, stream: DeploymentResponseGenerator, deadline: float) -> GenerateChunk:
        """The decoder's next chunk before `deadline`; past it, the generation is cancelled."""
        timeout = asyncio.timeout_at(deadline)
        try:
            async with timeout:
                return await stream.__anext__()
        except StopAsyncIteration:
            raise DecoderUnavailable("The decoder ended the stream without a final chunk.") from None
        except TimeoutError:
            if not timeout.expired():
                raise
            stream.cancel()
            raise self._timed_out() from None
        except Exception as exc:  # a full queue, a dead replica: ours to name
            raise from_serve(exc) from None

    async def _collect(
        self, first: GenerateChunk, stream: DeploymentResponseGenerator, deadline: float, cid: str
    ) -> dict:
        text, last = [first.text], first
        while last.finish_reason is None:
            last = await self._next(stream, deadline)
            text.append(last.text)
        usage = Usage(
            prompt_tokens=last.prompt_tokens,
            completion_tokens=last.completion_tokens,
            total_tokens=last.prompt_tokens + last.completion_tokens,
        )
        choice = Choice(message=ResponseMessage(content="".join(text)), finish_reason=last.finish_reason)
        return ChatCompletion(id=cid, model=self._config.model_name, choices=[choice], usage=usage).model_dump()

    async def _sse(
        self,
        first: GenerateChunk,
        stream: DeploymentResponseGenerator,
        deadline: float,
        cid: str,
        include_usage: bool,
        rid: str,
    ) -> AsyncIterator[str]:
        created = int(time.time())

        def event(
            delta: Delta, finish: FinishReason | None = None, usage: Usage | None = None, final: bool = False
        ) -> str:
            choices = [] if final else [ChunkChoice(delta=delta, finish_reason=finish)]
            chunk = ChatCompletionChunk(
                id=cid, created=created, model=self._config.model_name, choices=choices, usage=usage
            )
            data = chunk.model_dump()
            for choice in data["choices"]:
                choice["delta"] = {k: v for k, v in choice["delta"].items() if v is not None}
            return f"data: {json.dumps(data)}\n\n"

        chunk, done = first, False
        try:
            yield event(Delta(role="assistant", content=""))
            while True:
                if chunk.text:
                    yield event(Delta(content=chunk.text))
                if chunk.finish_reason is not None:
                    yield event(Delta(), finish=chunk.finish_reason)
                    if include_usage:
                        total = chunk.prompt_tokens + chunk.completion_tokens
                        usage = Usage(
                            prompt_tokens=chunk.prompt_tokens,
                            completion_tokens=chunk.completion_tokens,
                            total_tokens=total,
                        )
                        yield event(Delta(), usage=usage, final=True)
                    break
                chunk = await self._next(stream, deadline)
            done = True
        except Exception as exc:  # after the first byte: one error event, then [DONE]
            status, body, _ = to_openai_error(exc, rid)
            if status >= 500:
                logger.exception("stream %s failed", rid, exc_info=exc)
            yield f"data: {json.dumps(body)}\n\n"
            done = True
        finally:
            if not done:  # the client went away: free the decoder slot now
                stream.cancel()
        yield "data: [DONE]\n\n"

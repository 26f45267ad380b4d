"""One batch line run through the same service code as its endpoint's HTTP route (no HTTP hop): what
`Ingress.batch_line` answers the batch runner through its handle. Images, tools, structured output and
embeddings behave as over HTTP; a line's failure is its OpenAI error body and status, as the route
would answer it."""

from __future__ import annotations

import logging
from typing import Any

from deployments.errors import ServiceError, to_openai_error
from deployments.ingress.apis.chat.protocol import ChatCompletionRequest
from deployments.ingress.apis.chat.service import ChatService
from deployments.ingress.apis.completions.protocol import CompletionRequest
from deployments.ingress.apis.completions.service import CompletionService
from deployments.ingress.apis.embeddings.protocol import EmbeddingRequest
from deployments.ingress.apis.embeddings.service import EmbeddingService
from deployments.ingress.apis.responses.protocol import ResponseRequest
from deployments.ingress.apis.responses.service import ResponseService
from deployments.ingress.owners import Caller
from deployments.ingress.served_models import ServedModels
from deployments.monitoring.access_log import RequestRecord, error_code, log_access

logger = logging.getLogger("ray.serve")


async def _answer(served: ServedModels, endpoint: str, body: dict[str, Any], record: RequestRecord) -> Any:
    if endpoint == "/v1/chat/completions":
        chat = ChatCompletionRequest.model_validate(body)
        record.model = chat.model
        return (await ChatService(served.get(chat.model).core).create(chat, record)).body
    if endpoint == "/v1/completions":
        legacy = CompletionRequest.model_validate(body)
        record.model = legacy.model
        return (await CompletionService(served.get(legacy.model).core).create(legacy, record)).body
    if endpoint == "/v1/embeddings":
        embed = EmbeddingRequest.model_validate(body)
        record.model = embed.model
        return await EmbeddingService(served.embedder(embed.model).core).create(embed, record)
    if endpoint == "/v1/responses":
        response = ResponseRequest.model_validate(body)
        record.model = response.model
        # Not kept in the responses store: the runner acts for no API key (the batch's output is its record).
        reply = await ResponseService(served.get(response.model).core).create(response, record, None, Caller())
        return reply.body
    raise ValueError(f"not a batch endpoint: {endpoint}")


async def run_line(
    served: ServedModels, batch_id: str, endpoint: str, body: dict[str, Any], request_id: str
) -> dict[str, Any]:
    """`{"status_code", "body"}` of one line: the endpoint's answer (200), or its error as the route
    would send it. Its access-log line is an HTTP request's, with `batch=<batch id>`."""
    record = RequestRecord(request_id=request_id, method="POST", path=endpoint, batch=batch_id)
    try:
        answer = await _answer(served, endpoint, body, record)
        record.status = 200
        return {"status_code": 200, "body": answer}
    except Exception as exc:  # every failure is the line's answer, as the route maps it
        status, error, _ = to_openai_error(exc, request_id)
        if status >= 500 and not isinstance(exc, ServiceError):
            logger.exception("batch line %s to %s failed", request_id, endpoint)
        record.status, record.error = status, error_code(error)
        return {"status_code": status, "body": error}
    finally:
        log_access(record)

"""/v1/chat/completions."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from deployments.ingress.apis.chat.service import ChatService
from deployments.ingress.routing import BatchLine, recorded, streamed
from deployments.ingress.served_models import ServedModels
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.chat import ChatCompletionRequest

PATH = "/v1/chat/completions"


async def _batch_answer(served: ServedModels, body: ChatCompletionRequest, record: RequestRecord) -> Any:
    return (await ChatService(served.get(body.model).core).create(body, record)).body


BATCH_LINE = BatchLine(PATH, _batch_answer)


def attach(api: FastAPI, served: ServedModels) -> None:
    """Add the routes to `api`."""

    @api.post(PATH, responses=streamed("A chat.completion, or chunks when stream is true"))
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        record = recorded(request, body.model)
        return (await ChatService(served.get(body.model).core).create(body, record)).response()

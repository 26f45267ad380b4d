"""/v1/embeddings."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from deployments.ingress.apis.embeddings.service import EmbeddingService
from deployments.ingress.routing import ERRORS, BatchLine, recorded
from deployments.ingress.served_models import ServedModels
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.embeddings import EmbeddingList, EmbeddingRequest

PATH = "/v1/embeddings"


async def _batch_answer(served: ServedModels, body: EmbeddingRequest, record: RequestRecord) -> Any:
    return await EmbeddingService(served.embedder(body.model).core).create(body, record)


BATCH_LINE = BatchLine(PATH, _batch_answer)


def attach(api: FastAPI, served: ServedModels) -> None:
    """Add the routes to `api`."""

    @api.post(PATH, responses={200: {"model": EmbeddingList}, **ERRORS})
    async def embeddings(body: EmbeddingRequest, request: Request) -> Any:
        record = recorded(request, body.model)
        return JSONResponse(await EmbeddingService(served.embedder(body.model).core).create(body, record))

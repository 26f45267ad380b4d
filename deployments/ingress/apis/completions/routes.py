"""/v1/completions, the legacy text completions."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from deployments.ingress.apis.completions.service import CompletionService
from deployments.ingress.routing import BatchLine, recorded, streamed
from deployments.ingress.served_models import ServedModels
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.completions import CompletionRequest

PATH = "/v1/completions"


async def _batch_answer(served: ServedModels, body: CompletionRequest, record: RequestRecord) -> Any:
    return (await CompletionService(served.get(body.model).core).create(body, record)).body


BATCH_LINE = BatchLine(PATH, _batch_answer)


def attach(api: FastAPI, served: ServedModels) -> None:
    """Add the routes to `api`."""

    @api.post(PATH, responses=streamed("A text_completion, or chunks when stream is true"))
    async def legacy_completions(body: CompletionRequest, request: Request) -> Any:
        record = recorded(request, body.model)
        return (await CompletionService(served.get(body.model).core).create(body, record)).response()

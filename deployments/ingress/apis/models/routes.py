"""/v1/models, /v1/models/{model} and /health: what is served, and whether it can answer."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from deployments.ingress.limits.limiter import model_allowed
from deployments.ingress.routing import NOT_FOUND
from deployments.ingress.served_models import ServedModels
from deployments.protocol.openai.models import ModelCard, ModelList


def attach(api: FastAPI, served: ServedModels) -> None:
    """Add the routes to `api`."""

    @api.get("/v1/models", responses={401: NOT_FOUND[401]})
    async def models(request: Request) -> ModelList:
        allowed = model_allowed(request.state)  # a key limited to some models sees only those
        return ModelList(data=[card for card in served.cards.data if allowed(card.id)])

    @api.get("/v1/models/{model:path}", responses=NOT_FOUND)
    async def model_card(model: str, request: Request) -> ModelCard:
        if not model_allowed(request.state)(model):
            raise served.unknown(model)
        return served.card(model)

    @api.get("/health", responses={503: {"description": "No decoder is ready; the body says why"}})
    async def health() -> JSONResponse:
        body, code = await served.health()
        return JSONResponse(body, status_code=code)

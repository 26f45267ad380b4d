"""vLLM's /tokenize and /detokenize."""

from __future__ import annotations

from fastapi import FastAPI, Request

from deployments.ingress.apis.tokenize.service import TokenizeService
from deployments.ingress.routing import ERRORS, recorded
from deployments.ingress.served_models import ServedModels
from deployments.protocol.openai.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)


def attach(api: FastAPI, served: ServedModels) -> None:
    """Add the routes to `api`."""

    @api.post("/tokenize", responses=ERRORS)
    async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
        """The /tokenize of vLLM: a prompt's or a chat's tokens, as the model's decoder prompts with them."""
        model = served.get(body.model or served.names[0])
        return await TokenizeService(model.core).tokenize(body, recorded(request, model.card.id))

    @api.post("/detokenize", responses=ERRORS)
    async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
        """The /detokenize of vLLM: token ids as the model's text."""
        model = served.get(body.model or served.names[0])
        recorded(request, model.card.id)
        return await TokenizeService(model.core).detokenize(body)

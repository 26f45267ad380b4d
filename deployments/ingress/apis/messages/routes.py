"""Anthropic's /v1/messages and /v1/messages/count_tokens (errors in Anthropic's shape)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from deployments.ingress.apis.messages.service import MessagesService
from deployments.ingress.routing import ERRORS, Responses, recorded, streamed
from deployments.ingress.served_models import ServedModels
from deployments.protocol.anthropic import (
    AnthropicErrorResponse,
    MessagesInput,
    MessagesRequest,
    TokenCount,
)

_ERRORS: Responses = {
    status: {"model": AnthropicErrorResponse, "description": error["description"]} for status, error in ERRORS.items()
}


def attach(api: FastAPI, served: ServedModels) -> None:
    """Add the routes to `api`."""

    @api.post("/v1/messages", responses=streamed("A message, or its events when stream is true", _ERRORS))
    async def messages(body: MessagesRequest, request: Request) -> Any:
        """Anthropic's Messages API; `anthropic-version` is accepted, whatever its value."""
        record = recorded(request, body.model)
        return (await MessagesService(served.get(body.model).core).create(body, record)).response()

    @api.post("/v1/messages/count_tokens", responses=_ERRORS)
    async def count_tokens(body: MessagesInput, request: Request) -> TokenCount:
        record = recorded(request, body.model)
        return await MessagesService(served.get(body.model).core).count_tokens(body, record)

"""/v1/batches: create, retrieve, list, cancel. The lines run in the batch runner (`runner.py`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse

from deployments.ingress.limits.limiter import key_of
from deployments.ingress.routing import ERRORS, caller
from deployments.protocol.openai.batches import Batch, BatchCreateRequest, BatchList
from deployments.state.batches import BatchStore


def attach(api: FastAPI, batches: BatchStore | None, wake: Callable[[], None]) -> None:
    """`batches`: None when the storage root could not be opened; `wake`: tells the runner to look now."""
    if batches is None:
        return

    @api.post("/v1/batches", responses={200: {"model": Batch}, **ERRORS})
    async def create_batch(body: BatchCreateRequest, request: Request) -> Any:
        key = key_of(request.state)  # with limits, the batch's lines count against the key that made it
        name = (key.name, key.queue) if key is not None else None
        created = await asyncio.to_thread(batches.create, body.new_batch(), caller(request), name)
        wake()
        return JSONResponse(created)

    @api.get("/v1/batches", responses={200: {"model": BatchList}, **ERRORS})
    async def list_batches(request: Request, after: str | None = None, limit: int = Query(20, ge=1, le=100)) -> Any:
        return JSONResponse(await asyncio.to_thread(batches.list, caller(request), limit, after))

    @api.get("/v1/batches/{batch_id}", responses={200: {"model": Batch}, **ERRORS})
    async def retrieve_batch(batch_id: str, request: Request) -> Any:
        return JSONResponse(await asyncio.to_thread(batches.retrieve, batch_id, caller(request)))

    @api.post("/v1/batches/{batch_id}/cancel", responses={200: {"model": Batch}, **ERRORS})
    async def cancel_batch(batch_id: str, request: Request) -> Any:
        cancelled = await asyncio.to_thread(batches.cancel, batch_id, caller(request))
        wake()
        return JSONResponse(cancelled)

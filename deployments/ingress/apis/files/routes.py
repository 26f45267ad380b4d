"""/v1/files: upload (multipart, streamed: `form.py`), list, retrieve, content, delete."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from deployments.errors import InvalidRequestError
from deployments.ingress.apis.files.form import UploadForm
from deployments.ingress.guard import MULTIPART_MARGIN
from deployments.ingress.routing import ERRORS, caller
from deployments.protocol.openai.files import (
    EXPIRES_ANCHOR,
    EXPIRES_SECONDS,
    UPLOAD_FORM,
    FileDeleted,
    FileList,
    FileObject,
)
from deployments.state.files import ExpiresAfter, FileStore, checked_purpose
from deployments.state.owners import Caller


def attach(api: FastAPI, files: FileStore | None) -> None:
    """`files`: None when the storage root could not be opened (the routes then are not served)."""
    if files is None:
        return

    @api.post("/v1/files", responses={200: {"model": FileObject}, **ERRORS}, openapi_extra=UPLOAD_FORM)
    async def upload_file(request: Request) -> Any:
        # Read as it arrives, in a worker thread that takes the body's pieces from this loop: the file
        # goes to the storage root a chunk at a time, never held (nor spooled, as Starlette's form would).
        body = _blocking(request.stream(), asyncio.get_running_loop())
        form = UploadForm(body, request.headers.get("content-type", ""), files.config.max_file_bytes + MULTIPART_MARGIN)
        return JSONResponse(await asyncio.to_thread(_upload, files, form, caller(request)))

    @api.get("/v1/files", responses={200: {"model": FileList}, **ERRORS})
    async def list_files(
        request: Request,
        purpose: str | None = None,
        limit: int = Query(10_000, ge=1, le=10_000),
        after: str | None = None,
        order: Literal["asc", "desc"] = "desc",
    ) -> Any:
        return JSONResponse(await asyncio.to_thread(files.list, caller(request), purpose, limit, after, order))

    @api.get("/v1/files/{file_id}", responses={200: {"model": FileObject}, **ERRORS})
    async def retrieve_file(file_id: str, request: Request) -> Any:
        return JSONResponse(await asyncio.to_thread(files.retrieve, file_id, caller(request)))

    @api.get(
        "/v1/files/{file_id}/content",
        responses={200: {"content": {"application/octet-stream": {}}, "description": "The file's bytes"}, **ERRORS},
    )
    async def file_content(file_id: str, request: Request) -> Any:
        chunks = await asyncio.to_thread(files.content, file_id, caller(request))
        return StreamingResponse(chunks, media_type="application/octet-stream")

    @api.delete("/v1/files/{file_id}", responses={200: {"model": FileDeleted}, **ERRORS})
    async def delete_file(file_id: str, request: Request) -> Any:
        return JSONResponse(await asyncio.to_thread(files.delete, file_id, caller(request)))


def _upload(files: FileStore, form: UploadForm, who: Caller) -> dict[str, Any]:
    """Keep the form's file: checked against what the fields before it say, the rest after it."""
    if not form.find_file():
        raise InvalidRequestError("The form has no `file` part.", param="file")
    early = form.fields
    if "purpose" in early:
        checked_purpose(early["purpose"])
    if EXPIRES_ANCHOR in early or EXPIRES_SECONDS in early:
        ExpiresAfter.parse(early.get(EXPIRES_ANCHOR), early.get(EXPIRES_SECONDS))
    received = files.receive(form.chunks(), who, early.get("purpose"))
    try:
        fields = form.rest()
        expires_after = ExpiresAfter.parse(fields.get(EXPIRES_ANCHOR), fields.get(EXPIRES_SECONDS))
    except BaseException:
        files.abandon(received)
        raise
    return files.accept(received, form.filename or "upload.jsonl", fields.get("purpose"), who, expires_after)


def _blocking(stream: AsyncIterator[bytes], loop: asyncio.AbstractEventLoop) -> Iterator[bytes]:
    """An async stream read from a worker thread: each piece awaited on `loop`, which owns it."""

    async def next_piece() -> bytes | None:
        return await anext(stream, None)

    while (piece := asyncio.run_coroutine_threadsafe(next_piece(), loop).result()) is not None:
        yield piece

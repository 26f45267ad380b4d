"""/v1/files: upload (multipart), list, retrieve, content, delete."""

from __future__ import annotations

import asyncio
import functools
from typing import Annotated, Any, Literal

from fastapi import FastAPI, File, Form, Query, Request, UploadFile
from fastapi.responses import JSONResponse, StreamingResponse

from deployments.ingress.apis.files.protocol import FileDeleted, FileList, FileObject, UploadPurpose
from deployments.ingress.batches.files import FileStore
from deployments.ingress.batches.storage import CHUNK_BYTES
from deployments.ingress.routing import ERRORS, caller


def attach(api: FastAPI, files: FileStore | None) -> None:
    """`files`: None when the storage root could not be opened (the routes then are not served)."""
    if files is None:
        return

    @api.post("/v1/files", responses={200: {"model": FileObject}, **ERRORS})
    async def upload_file(
        request: Request, file: Annotated[UploadFile, File()], purpose: Annotated[UploadPurpose, Form()]
    ) -> Any:
        # Starlette has spooled the part to a temporary file; it goes to the storage root a chunk at a time.
        chunks = iter(functools.partial(file.file.read, CHUNK_BYTES), b"")
        who = caller(request)
        created = await asyncio.to_thread(files.create, file.filename or "upload.jsonl", chunks, purpose, who)
        return JSONResponse(created)

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

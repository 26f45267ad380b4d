"""/v1/responses (HTTP and WebSocket), its stored responses, and /v1/responses/compact."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI, Query, Request, WebSocket
from fastapi.responses import JSONResponse

from deployments.ingress.answer.reply import Reply
from deployments.ingress.apis.responses.service import ResponseService
from deployments.ingress.apis.responses.socket import ResponseSocket, connection_id
from deployments.ingress.apis.responses.store import (
    ConnectionCache,
    ConversationPort,
    ResponseStorePort,
    delete_entry,
    stored_entry,
)
from deployments.ingress.limits.limiter import Admission, Limiter, key_of
from deployments.ingress.routing import ERRORS, NOT_FOUND, BatchLine, caller, recorded, request_id, streamed
from deployments.ingress.served_models import ServedModels
from deployments.monitoring.access_log import RequestRecord, turn_log_of
from deployments.protocol.openai.response_object import CompactedResponse, CompactRequest, InputItemList
from deployments.protocol.openai.responses import ResponseRequest
from deployments.state.owners import Caller
from deployments.state.records import page

PATH = "/v1/responses"


async def _batch_answer(served: ServedModels, body: ResponseRequest, record: RequestRecord) -> Any:
    # Not kept in the responses store: the runner acts for no API key (the batch's output is its record).
    return (await ResponseService(served.get(body.model).core).create(body, record, None, Caller())).body


BATCH_LINE = BatchLine(PATH, _batch_answer)


def input_items(items: list[dict[str, Any]], limit: int, order: str, after: str | None) -> InputItemList:
    """A page of a stored response's input items: `order` by position (desc: newest first), after
    the item `after` names.
    """
    return InputItemList(**page(items[::-1] if order == "desc" else list(items), limit, after))


def attach(
    api: FastAPI,
    served: ServedModels,
    store: ResponseStorePort | None,
    max_message_bytes: int,
    limiter: Limiter | None = None,
    conversations: ConversationPort | None = None,
) -> None:
    """`store`: the responses kept (None: none are); `max_message_bytes`: a WebSocket message's cap;
    `limiter`: the keys' limits, which admit each WebSocket turn (HTTP requests pass its middleware);
    `conversations`: those a response may belong to (`conversation`; None: none are served).
    """

    @api.post(PATH, responses=streamed("A response, or its events when stream is true"))
    async def create_response(body: ResponseRequest, request: Request) -> Any:
        record = recorded(request, body.model)
        service = ResponseService(served.get(body.model).core)
        who = caller(request, record.request_id)
        return (await service.create(body, record, store, who, conversations=conversations)).response()

    @api.websocket(PATH)
    async def response_socket(websocket: WebSocket) -> None:
        """The WebSocket mode: `response.create` turns on one connection (`socket`)."""
        key = key_of(websocket.state)
        admitted: dict[str, Admission] = {}  # each turn is admitted by the limits as a request is

        async def turn(
            body: ResponseRequest, record: RequestRecord, connection: ConnectionCache, message: dict[str, Any]
        ) -> Reply:
            who = caller(websocket, record.request_id)
            record.key_digest = who.key_digest  # the turn reads the caller's own /v1/files, as a request does
            if limiter is not None and key is not None:
                limiter.check_model(key, body.model)
                record.tenant = key.tenant
                request = {k: v for k, v in message.items() if k != "type"}  # as a body is read (any depth)
                admitted[record.request_id] = await limiter.admit(key, PATH, request, False, who.key_digest)
            service = ResponseService(served.get(body.model).core)
            return await service.create(body, record, store, who, connection, conversations)

        log = turn_log_of(websocket.state)

        def turn_ended(record: RequestRecord) -> None:
            admission = admitted.pop(record.request_id, None)
            if limiter is not None and admission is not None:
                limiter.settle(admission, record)
            log(record)

        rid = request_id(websocket.scope)
        await ResponseSocket(
            websocket,
            turn,
            max_message_bytes=max_message_bytes,
            request_id=connection_id() if rid == "unknown" else rid,
            log=turn_ended,
        ).run()

    @api.post("/v1/responses/compact", responses={200: {"model": CompactedResponse}, **ERRORS})
    async def compact_response(body: CompactRequest, request: Request) -> Any:
        record = recorded(request, body.model)
        service = ResponseService(served.get(body.model).core)
        return JSONResponse(await service.compact(body, record, store, caller(request, record.request_id)))

    @api.get("/v1/responses/{response_id}", responses=NOT_FOUND)
    async def get_response(response_id: str, request: Request) -> Any:
        return JSONResponse((await stored_entry(store, response_id, caller(request)))["response"])

    @api.delete("/v1/responses/{response_id}", responses=NOT_FOUND)
    async def delete_response(response_id: str, request: Request) -> Any:
        await delete_entry(store, response_id, caller(request))
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    @api.get("/v1/responses/{response_id}/input_items", responses=NOT_FOUND)
    async def response_input_items(
        response_id: str,
        request: Request,
        limit: int = Query(20, ge=1, le=100),
        order: Literal["asc", "desc"] = "desc",
        after: str | None = None,
    ) -> InputItemList:
        return input_items((await stored_entry(store, response_id, caller(request)))["input"], limit, order, after)

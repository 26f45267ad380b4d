"""The Conversations API: /v1/conversations (create, retrieve, update, delete) and its items (list,
add, retrieve, delete), over the conversations' store (`state/conversations.py`: a store, not a
service over a model's core). `include` is accepted where OpenAI takes it and changes nothing: an
item is kept whole.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse

from deployments.ingress.routing import ERRORS, caller
from deployments.protocol.openai.conversations import (
    Conversation,
    ConversationCreateRequest,
    ConversationDeleted,
    ConversationItemList,
    ConversationUpdateRequest,
    ItemsCreateRequest,
    as_stored,
)
from deployments.protocol.openai.items import InputItem
from deployments.state.conversations import ConversationStore
from deployments.state.records import page

Include = Annotated[list[str] | None, Query(description="Accepted and ignored: an item is kept and answered whole.")]


def attach(api: FastAPI, conversations: ConversationStore | None) -> None:
    """`conversations`: None when there is no storage root for them (the routes then are not served)."""
    if conversations is None:
        return
    store = conversations

    @api.post("/v1/conversations", responses={200: {"model": Conversation}, **ERRORS})
    async def create_conversation(body: ConversationCreateRequest, request: Request) -> Any:
        created = await asyncio.to_thread(store.create, as_stored(body.items), body.metadata, caller(request))
        return JSONResponse(created)

    @api.get("/v1/conversations/{conversation_id}", responses={200: {"model": Conversation}, **ERRORS})
    async def retrieve_conversation(conversation_id: str, request: Request) -> Any:
        return JSONResponse(await asyncio.to_thread(store.retrieve, conversation_id, caller(request)))

    @api.post("/v1/conversations/{conversation_id}", responses={200: {"model": Conversation}, **ERRORS})
    async def update_conversation(conversation_id: str, body: ConversationUpdateRequest, request: Request) -> Any:
        updated = await asyncio.to_thread(store.update, conversation_id, body.metadata, caller(request))
        return JSONResponse(updated)

    @api.delete("/v1/conversations/{conversation_id}", responses={200: {"model": ConversationDeleted}, **ERRORS})
    async def delete_conversation(conversation_id: str, request: Request) -> Any:
        return JSONResponse(await asyncio.to_thread(store.delete, conversation_id, caller(request)))

    @api.get("/v1/conversations/{conversation_id}/items", responses={200: {"model": ConversationItemList}, **ERRORS})
    async def list_items(
        conversation_id: str,
        request: Request,
        after: str | None = None,
        limit: int = Query(20, ge=1, le=100),
        order: Literal["asc", "desc"] = "desc",
        include: Include = None,
    ) -> Any:
        listed = await asyncio.to_thread(store.list_items, conversation_id, caller(request), limit, after, order)
        return JSONResponse(listed)

    @api.post("/v1/conversations/{conversation_id}/items", responses={200: {"model": ConversationItemList}, **ERRORS})
    async def create_items(
        conversation_id: str,
        body: ItemsCreateRequest,
        request: Request,
        include: Include = None,
    ) -> Any:
        added = await asyncio.to_thread(store.add, conversation_id, as_stored(body.items), caller(request))
        return JSONResponse(page(added, len(added), None))

    @api.get("/v1/conversations/{conversation_id}/items/{item_id}", responses={200: {"model": InputItem}, **ERRORS})
    async def retrieve_item(
        conversation_id: str,
        item_id: str,
        request: Request,
        include: Include = None,
    ) -> Any:
        return JSONResponse(await asyncio.to_thread(store.item, conversation_id, item_id, caller(request)))

    @api.delete(
        "/v1/conversations/{conversation_id}/items/{item_id}", responses={200: {"model": Conversation}, **ERRORS}
    )
    async def delete_item(conversation_id: str, item_id: str, request: Request) -> Any:
        deleted = await asyncio.to_thread(store.delete_item, conversation_id, item_id, caller(request))
        return JSONResponse(deleted)

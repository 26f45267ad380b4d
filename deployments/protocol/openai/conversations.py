"""The Conversations API's wire: its requests (items as the Responses API's input items, at most 20
at a time; metadata within OpenAI's bounds), OpenAI's conversation object, its deletion's answer and
the item list.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from deployments.protocol.openai.common import Metadata, RequestModel
from deployments.protocol.openai.items import InputItem

ITEMS_AT_ONCE = 20  # OpenAI's: "You may add up to 20 items at a time."


class ConversationCreateRequest(RequestModel):
    """The create body of /v1/conversations: its first items and metadata."""

    items: list[InputItem] | None = Field(None, max_length=ITEMS_AT_ONCE)
    metadata: Metadata | None = None


class ConversationUpdateRequest(RequestModel):
    """The update body of a conversation: its new metadata."""

    metadata: Metadata | None = Field(description="Replaces the conversation's metadata (null: none).")


class ItemsCreateRequest(RequestModel):
    """Items added to a conversation, at most 20 at a time."""

    items: list[InputItem] = Field(min_length=1, max_length=ITEMS_AT_ONCE)


def as_stored(items: list[Any] | None) -> list[dict[str, Any]]:
    """The validated items as the store keeps them (it gives each its id)."""
    return [item.model_dump(exclude_none=True) for item in items or []]


class Conversation(BaseModel):
    """OpenAI's conversation object."""

    id: str
    object: Literal["conversation"] = "conversation"
    created_at: int
    metadata: dict[str, str] = Field(default_factory=dict)


class ConversationDeleted(BaseModel):
    """A deletion's answer."""

    id: str
    object: Literal["conversation.deleted"] = "conversation.deleted"
    deleted: bool = True


class ConversationItemList(BaseModel):
    """A page of a conversation's items."""

    object: Literal["list"] = "list"
    data: list[InputItem]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False

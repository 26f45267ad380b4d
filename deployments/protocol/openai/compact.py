"""OpenAI's /v1/responses/compact: the request (a conversation as /v1/responses takes it: `input`
items, `previous_response_id`, `instructions`) and the `response.compaction` object, whose output
is the conversation's user messages followed by one `compaction` item that holds the summary the
model wrote; a client sends that output back as the input of a new chain."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from deployments.protocol.openai.common import RequestModel
from deployments.protocol.openai.responses import InputItem, MessageItem, ResponseUsage


class CompactRequest(RequestModel):
    model: str = Field(min_length=1)
    input: Annotated[str, Field(min_length=1)] | Annotated[list[InputItem], Field(min_length=1)] | None = None
    previous_response_id: str | None = None
    instructions: str | None = None
    # Harmless: accepted and ignored.
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None

    @property
    def items(self) -> list[Any]:
        """The input as items (a string is one user message; none: no new items)."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input or [])


class CompactionOutput(BaseModel):
    """The summary item: its `encrypted_content` is the summary's plain text (not encrypted)."""

    id: str
    type: Literal["compaction"] = "compaction"
    encrypted_content: str
    created_by: str | None = None


class CompactedResponse(BaseModel):
    id: str
    object: Literal["response.compaction"] = "response.compaction"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    output: list[dict[str, Any]] = Field(description="The user messages, then the one compaction item.")
    usage: ResponseUsage

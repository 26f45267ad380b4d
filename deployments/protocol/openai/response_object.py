"""The Responses API's answer (/v1/responses): the `response` object with its output items and usage,
the stored input items' list, and /v1/responses/compact's request and answer.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from deployments.protocol.openai.common import RequestModel, VisionFields, absent
from deployments.protocol.openai.items import InputItem, MessageItem


class OutputTextPart(BaseModel):
    """The text of an output message (`output_text`)."""

    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[Any] = Field(default_factory=list)


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputMessage(BaseModel):
    """An assistant message among a response's output items."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus = "in_progress"
    content: list[OutputTextPart] = Field(default_factory=list)


class OutputFunctionCall(BaseModel):
    """A function call among a response's output items; `arguments` is its JSON text."""

    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    namespace: str | None = Field(None, exclude_if=absent, description="The `namespace` tool the function is in.")
    arguments: str = ""
    status: ItemStatus = "in_progress"


OutputItem = OutputMessage | OutputFunctionCall


class InputTokensDetails(BaseModel):
    """The input tokens' detail in a response's usage (`cached_tokens`)."""

    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    """The output tokens' detail in a response's usage (`reasoning_tokens`)."""

    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    """A response's token counts, as the Responses API reports them."""

    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class IncompleteDetails(BaseModel):
    """Why a response is incomplete: it reached `max_output_tokens`."""

    reason: Literal["max_output_tokens"]


ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed"]


class Response(VisionFields):
    """The `response` object; the fields of the request it echoes keep the request's values, and
    the sampling fields a request cannot set here say what this server uses (OpenAI's defaults
    where the request leaves them out, as OpenAI reports them).
    """

    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    completed_at: int | None = None
    status: ResponseStatus = "in_progress"
    error: dict[str, Any] | None = None
    incomplete_details: IncompleteDetails | None = None
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    usage: ResponseUsage | None = None
    instructions: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    temperature: float = 1.0
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_logprobs: int = 0
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    store: bool = True
    previous_response_id: str | None = None
    conversation: dict[str, str] | None = None  # {"id": ...}: the conversation it was added to
    user: str | None = Field(None, exclude_if=absent)
    truncation: Literal["disabled"] = "disabled"
    reasoning: dict[str, Any] = Field(default_factory=lambda: {"effort": None, "summary": None})
    background: bool = False
    service_tier: str = "default"
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


class InputItemList(BaseModel):
    """`GET /v1/responses/{id}/input_items`: the stored input items, newest first by default."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class CompactRequest(RequestModel):
    """The body of a /v1/responses/compact request: a conversation as /v1/responses takes it."""

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


class CompactedResponse(BaseModel):
    """The `response.compaction` object that /v1/responses/compact answers with."""

    id: str
    object: Literal["response.compaction"] = "response.compaction"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    output: list[dict[str, Any]] = Field(description="The user messages, then the one compaction item.")
    usage: ResponseUsage

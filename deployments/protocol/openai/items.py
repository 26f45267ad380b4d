"""The items of OpenAI's Responses API as a request carries them (messages with their parts, function
calls and their outputs, compaction summaries): the wire that /v1/responses' input and the
Conversations API's items share.
"""

from __future__ import annotations

import secrets
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from deployments.protocol.openai.common import RequestModel


class InputText(RequestModel):
    """A text part of an input message."""

    type: Literal["input_text"]
    text: str


class InputImage(RequestModel):
    """An image part of an input message."""

    type: Literal["input_image"]
    image_url: str = Field(min_length=1, description="An http(s) URL or a data URL (file_id is not supported).")
    detail: Literal["auto", "low", "high", "original"] = "auto"


class InputFile(RequestModel):
    """A document (PDF, plain text, Markdown, CSV): exactly one of `file_data` (a data URL, or bare
    base64), `file_id` (a /v1/files upload of the caller's) and `file_url` (http(s), behind the SSRF
    guard). Read into text by the ingress, for any model (docs/documents.md).
    """

    type: Literal["input_file"]
    file_data: str | None = Field(None, min_length=1)
    file_id: str | None = Field(None, min_length=1)
    file_url: str | None = Field(None, min_length=1)
    filename: str | None = Field(None, max_length=512)
    detail: Literal["auto", "low", "high"] | None = None  # accepted, set aside

    @model_validator(mode="after")
    def _one_source(self) -> InputFile:
        given = [name for name in ("file_data", "file_id", "file_url") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"needs exactly one of file_data, file_id, file_url (got {', '.join(given) or 'none'})")
        return self


class OutputText(RequestModel):
    """An earlier answer's text, sent back as an assistant message's content."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] | None = None


class Refusal(RequestModel):
    """An earlier answer's refusal, sent back as an assistant message's content."""

    type: Literal["refusal"]
    refusal: str


InputPart = Annotated[InputText | InputImage | InputFile, Field(discriminator="type")]
MessagePart = Annotated[InputText | InputImage | InputFile | OutputText | Refusal, Field(discriminator="type")]


class MessageItem(RequestModel):
    """A message item: a role and its content."""

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[MessagePart]
    id: str | None = None
    status: str | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallItem(RequestModel):
    """An earlier answer's function call, sent back as an item."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    namespace: str | None = Field(None, description="The `namespace` tool whose function this is (Codex's groups).")
    arguments: str = Field(description="JSON text, as the model produced it.")
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(RequestModel):
    """A function call's output, answering the call `call_id` names."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[InputPart]
    id: str | None = None
    status: str | None = None


class CompactionItem(RequestModel):
    """The summary that /v1/responses/compact wrote, sent back as it came: this server's
    `encrypted_content` is the summary's plain text (nothing is encrypted).
    """

    type: Literal["compaction"]
    encrypted_content: str = Field(max_length=10_485_760)
    id: str | None = None
    created_by: str | None = None


def _item_type(value: Any) -> str:
    """An item's tag: its `type`, ``message`` when a message leaves it out (OpenAI's easy form)."""
    item_type = value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", "message")
    return str(item_type)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[CompactionItem, Tag("compaction")],
    Discriminator(_item_type),
]


ITEM_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "compaction": "cmp"}


def item_id(prefix: str) -> str:
    """A new id of this service's for an item or a response (`msg_...`, `resp_...`)."""
    return f"{prefix}_{secrets.token_hex(16)}"  # 32 hex digits


def new_item_id(item_type: str) -> str:
    """A new id for an item of `item_type`, with that type's prefix."""
    return item_id(ITEM_ID_PREFIXES.get(item_type, "item"))


def kept_item(fields: dict[str, Any]) -> dict[str, Any]:
    """An item (its fields) as it is kept and listed (a stored response's input, a conversation's
    items): its `type` (`message` where left out), a message's text `content` as one part (as OpenAI
    lists it), and an id by its type where it has none.
    """
    item = dict(fields)
    item.setdefault("type", "message")
    if item["type"] == "message" and isinstance(item.get("content"), str):
        part = "output_text" if item.get("role") == "assistant" else "input_text"
        item["content"] = [{"type": part, "text": item["content"]}]
    item["id"] = item.get("id") or new_item_id(item["type"])
    return item

"""The chat form, which the request of every API becomes (OpenAI's chat messages and function tools:
chat completions take it as it is; Responses, Anthropic's Messages and /tokenize turn theirs into
it), and what every API's answer is made of: the tool-call deltas and the choices' finish reasons."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from deployments.protocol.openai.common import (
    FilePart,
    FunctionDefinition,
    ImagePart,
    RequestModel,
    TextPart,
    absent,
)

UserPart = Annotated[TextPart | ImagePart | FilePart, Field(discriminator="type")]


class SystemMessage(RequestModel):
    role: Literal["system", "developer"]
    content: str | list[TextPart]
    name: str | None = None


class UserMessage(RequestModel):
    role: Literal["user"]
    content: str | list[UserPart]
    name: str | None = None


class FunctionCallParam(RequestModel):
    name: str = Field(min_length=1)
    arguments: str = Field(description="JSON text, as the model produced it.")


class ToolCallParam(RequestModel):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCallParam


class AssistantMessage(RequestModel):
    role: Literal["assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCallParam] | None = None


class ToolMessage(RequestModel):
    role: Literal["tool"]
    content: str | list[TextPart]
    tool_call_id: str = Field(min_length=1)


ChatMessage = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]


class Tool(RequestModel):
    type: Literal["function"]
    function: FunctionDefinition


ChoiceFinish = Literal["stop", "length", "tool_calls"]


class ToolCallDeltaFunction(BaseModel):
    """A call's first delta has its name (and the arguments so far); the next ones only arguments."""

    name: str | None = Field(None, exclude_if=absent)
    arguments: str = ""


class ToolCallDelta(BaseModel):
    """One streamed piece of a tool call: the first names it (`id`, `type`, `function.name`), the
    next ones carry `function.arguments` fragments, as OpenAI and vLLM stream them."""

    index: int
    id: str | None = Field(None, exclude_if=absent)
    type: Literal["function"] | None = Field(None, exclude_if=absent)
    function: ToolCallDeltaFunction

"""OpenAI's chat completions (/v1/chat/completions), whose chat form every API's request becomes.

The chat form: OpenAI's chat messages and function tools (chat completions take it as it is;
Responses, Anthropic's Messages and /tokenize turn theirs into it), and what every API's answer is
made of: the tool-call deltas and the choices' finish reasons. Then chat completions' own wire: the
request (response formats; harmless fields such as `user`, `metadata`, `store` are accepted), the
`chat.completion` answer and its stream's `chat.completion.chunk`.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from deployments.protocol.openai.common import (
    FilePart,
    FunctionDefinition,
    ImagePart,
    RequestModel,
    SamplingFields,
    TextPart,
    TokenLogprob,
    ToolCall,
    Usage,
    VisionFields,
    absent,
)

UserPart = Annotated[TextPart | ImagePart | FilePart, Field(discriminator="type")]


class SystemMessage(RequestModel):
    """A system or developer message: text only."""

    role: Literal["system", "developer"]
    content: str | list[TextPart]
    name: str | None = None


class UserMessage(RequestModel):
    """A user message: text, or parts (text, images, documents)."""

    role: Literal["user"]
    content: str | list[UserPart]
    name: str | None = None


class FunctionCallParam(RequestModel):
    """The function an earlier tool call called, and its arguments."""

    name: str = Field(min_length=1)
    arguments: str = Field(description="JSON text, as the model produced it.")


class ToolCallParam(RequestModel):
    """An earlier answer's tool call, sent back in an assistant message."""

    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCallParam


class AssistantMessage(RequestModel):
    """An earlier answer: its text, or its tool calls, or both."""

    role: Literal["assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCallParam] | None = None


class ToolMessage(RequestModel):
    """A tool's result, answering the call `tool_call_id` names."""

    role: Literal["tool"]
    content: str | list[TextPart]
    tool_call_id: str = Field(min_length=1)


ChatMessage = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]


class Tool(RequestModel):
    """A function tool the model may call."""

    type: Literal["function"]
    function: FunctionDefinition


ChoiceFinish = Literal["stop", "length", "tool_calls"]


class ToolCallDeltaFunction(BaseModel):
    """A call's first delta has its name (and the arguments so far); the next ones only arguments."""

    name: str | None = Field(None, exclude_if=absent)
    arguments: str = ""


class ToolCallDelta(BaseModel):
    """One streamed piece of a tool call: the first names it (`id`, `type`, `function.name`), the
    next ones carry `function.arguments` fragments, as OpenAI and vLLM stream them.
    """

    index: int
    id: str | None = Field(None, exclude_if=absent)
    type: Literal["function"] | None = Field(None, exclude_if=absent)
    function: ToolCallDeltaFunction


class NamedFunction(RequestModel):
    """The function a `tool_choice` names."""

    name: str = Field(min_length=1)


class NamedToolChoice(RequestModel):
    """A `tool_choice` that forces one function."""

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaFormat(RequestModel):
    """The schema a `json_schema` response format constrains the answer to."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class TextFormat(RequestModel):
    """Plain text (the default response format)."""

    type: Literal["text"]


class JsonObjectFormat(RequestModel):
    """Any JSON object."""

    type: Literal["json_object"]


class JsonSchemaResponseFormat(RequestModel):
    """JSON that matches the given schema."""

    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaResponseFormat, Field(discriminator="type")]


# OpenAI fields this server does not implement: a 400 that names the field, never silently ignored.
UNSUPPORTED_CHAT_FIELDS = (
    "audio",
    "functions",
    "function_call",
    "prediction",
    "web_search_options",
    "reasoning_effort",
    "verbosity",
    "moderation",
)


class ChatCompletionRequest(SamplingFields):
    """The body of /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, gt=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    modalities: list[Literal["text"]] | None = None
    # vLLM's extensions of the chat's rendering.
    chat_template_kwargs: dict[str, Any] | None = Field(
        None,
        description="Extension (vLLM's): extra variables for the chat template (e.g. Qwen3's enable_thinking).",
    )
    add_generation_prompt: bool = Field(
        True, description="Extension (vLLM's): the template's opening of the assistant's answer."
    )
    continue_final_message: bool = Field(
        False,
        description="Extension (vLLM's): the final (assistant) message left open, for the answer to continue it; "
        "needs add_generation_prompt: false.",
    )
    # Declared (null only) so that the 400 names them and the OpenAPI spec says so (UNSUPPORTED_CHAT_FIELDS).
    audio: None = None
    functions: None = None
    function_call: None = None
    prediction: None = None
    web_search_options: None = None
    reasoning_effort: None = None
    verbosity: None = None
    moderation: None = None

    @field_validator(*UNSUPPORTED_CHAT_FIELDS, mode="before")
    @classmethod
    def _unsupported(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError("not supported by this server")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("needs logprobs: true")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_names_a_tool(cls, value: Any, info: ValidationInfo) -> Any:
        tools = info.data.get("tools")
        if value is not None and value != "none" and not tools:
            raise ValueError("needs tools")
        if isinstance(value, NamedToolChoice) and value.function.name not in {t.function.name for t in tools or []}:
            raise ValueError(f"names the function {value.function.name!r}, which is not in tools")
        return value

    @model_validator(mode="after")
    def _rendering_and_constraints_agree(self) -> ChatCompletionRequest:
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise ValueError("continue_final_message needs the last message to be the assistant's")
        formatted = self.response_format is not None and self.response_format.type != "text"
        if self.structured_outputs is not None and formatted:
            raise ValueError("structured_outputs and response_format cannot be combined")
        limit = self.completion_limit
        if limit is not None and self.min_tokens > limit:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be at most max_completion_tokens ({limit})")
        return self

    @property
    def completion_limit(self) -> int | None:
        """`max_completion_tokens` wins over the deprecated `max_tokens`."""
        return self.max_completion_tokens or self.max_tokens


class ChoiceLogprobs(BaseModel):
    """A choice's token logprobs."""

    content: list[TokenLogprob] | None = None
    refusal: None = None


class ResponseMessage(BaseModel):
    """A whole choice's message: its text or its tool calls."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = Field(None, exclude_if=absent)


class Choice(BaseModel):
    """One whole choice, with how it finished."""

    index: int = 0
    message: ResponseMessage
    finish_reason: ChoiceFinish
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(VisionFields):
    """OpenAI's `chat.completion`: the whole answer."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[Choice]
    usage: Usage


class Delta(BaseModel):
    """What a chunk adds to a choice: the role first, then text or tool-call pieces."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    """One choice's piece of a chunk; the last one says how it finished."""

    index: int = 0
    delta: Delta
    finish_reason: ChoiceFinish | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(VisionFields):
    """OpenAI's `chat.completion.chunk`: one event of a streamed answer."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None

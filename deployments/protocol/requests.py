"""OpenAI's request bodies: chat completions and legacy completions.

Requests forbid unknown fields: an unsupported OpenAI feature is a 400 that names it rather than
being silently ignored. Harmless fields (`user`, `metadata`, `store`, ...) are accepted.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ImageURL(_Request):
    url: str = Field(min_length=1)
    detail: Literal["auto", "low", "high"] = "auto"


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ImagePart(_Request):
    type: Literal["image_url"]
    image_url: ImageURL


UserPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class SystemMessage(_Request):
    role: Literal["system", "developer"]
    content: str | list[TextPart]
    name: str | None = None


class UserMessage(_Request):
    role: Literal["user"]
    content: str | list[UserPart]
    name: str | None = None


class FunctionCallParam(_Request):
    name: str = Field(min_length=1)
    arguments: str = Field(description="JSON text, as the model produced it.")


class ToolCallParam(_Request):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCallParam


class AssistantMessage(_Request):
    role: Literal["assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCallParam] | None = None


class ToolMessage(_Request):
    role: Literal["tool"]
    content: str | list[TextPart]
    tool_call_id: str = Field(min_length=1)


ChatMessage = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]


class StreamOptions(_Request):
    include_usage: bool = False


StopString = Annotated[str, Field(min_length=1)]
LogitBias = dict[str, Annotated[float, Field(ge=-100, le=100)]]


class FunctionDefinition(_Request):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class Tool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Request):
    name: str = Field(min_length=1)


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaFormat(_Request):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class TextFormat(_Request):
    type: Literal["text"]


class JsonObjectFormat(_Request):
    type: Literal["json_object"]


class JsonSchemaResponseFormat(_Request):
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


class SamplingFields(_Request):
    """What chat and legacy completions share."""

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, gt=0)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, description="Extension (vLLM's): 0 or null for no top-k.")
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    stop: StopString | Annotated[list[StopString], Field(max_length=4)] | None = Field(
        None, description="Up to 4 non-empty sequences; generation stops before any of them."
    )
    seed: int | None = Field(None, ge=-(2**63), lt=2**63, description="A 64-bit integer.")
    n: int = Field(1, ge=1, le=128, description="Independent choices, up to the server's `server.max_n`.")
    logit_bias: LogitBias | None = Field(None, description="Token id (as a string) -> bias from -100 to 100.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Harmless: accepted and ignored.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, value: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if value is not None and not info.data.get("stream"):
            raise ValueError("only allowed when stream is true")
        return value

    @property
    def stop_sequences(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, gt=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    modalities: list[Literal["text"]] | None = None
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

    @property
    def completion_limit(self) -> int | None:
        """`max_completion_tokens` wins over the deprecated `max_tokens`."""
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(SamplingFields):
    """The legacy `/v1/completions`: a prompt used as it is, no chat template."""

    prompt: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=32)]
        | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
        | Annotated[
            list[Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]], Field(min_length=1, max_length=32)
        ]
    )
    max_tokens: int | None = Field(16, gt=0, description="OpenAI's default for this endpoint is 16.")
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = Field(None, ge=1, le=1, description="Only 1 (or null).")
    suffix: None = Field(None, description="Not supported: insertion needs a fill-in-the-middle model.")

    @field_validator("echo")
    @classmethod
    def _echo_without_logprobs(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("logprobs") is not None:
            raise ValueError("echo with logprobs is not supported (prompt logprobs are not computed)")
        return value

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: a string, or a list of token ids."""
        prompt: Any = self.prompt
        if isinstance(prompt, str) or isinstance(prompt[0], int):
            return [prompt]
        return list(prompt)

"""Wire schema: OpenAI chat-completions request/response models, and the small typed payloads the
deployments pass to each other through handles (never Starlette requests, PIL images or tensors).

Requests forbid unknown fields: an unsupported OpenAI feature is a 400 that names it rather than
being silently ignored. Harmless fields (`user`, `metadata`, `store`, ...) are accepted.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

# --------------------------------------------------------------------------- request


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


class _SamplingFields(_Request):
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


class ChatCompletionRequest(_SamplingFields):
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


class CompletionRequest(_SamplingFields):
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


# --------------------------------------------------------------------------- response


FinishReason = Literal["stop", "length"]
ChoiceFinish = Literal["stop", "length", "tool_calls"]

UnseenReason = Literal["captioner_unavailable", "captioner_timeout"]
DEGRADED_FINGERPRINT = "mmserve-vision-degraded"


class UnseenImage(BaseModel):
    """One image the decoder was told about but that no caption describes."""

    index: int = Field(description="Position among the request's images, 0-based, in conversation order.")
    reason: UnseenReason = Field(
        description="captioner_unavailable: it failed to load, died, or failed recently; "
        "captioner_timeout: it did not answer within proxy_vision.timeout_s."
    )
    message: str = Field(description="What the ingress knows of the cause, in words.")


class VisionReport(BaseModel):
    """Which images of the request the decoder did not see, and why."""

    degraded: Literal[True] = True
    unseen_images: list[UnseenImage] = Field(min_length=1)


def _absent(value: object) -> bool:
    return value is None


class _VisionFields(BaseModel):
    """What a response says when an image was not seen; both fields are absent when every image was.

    `vision` is a top-level extension field because the official openai client keeps unknown
    top-level fields (`completion.vision`, `completion.model_extra`); on a stream it is on the first
    chunk. LangChain's ChatOpenAI drops unknown fields at every level, but keeps
    `system_fingerprint` in the message's `response_metadata` (on a stream, from the chunk with
    the finish reason): OpenAI defines it as the backend configuration that produced the answer,
    and an answer produced without the captioner comes from a different one, so it is
    `DEGRADED_FINGERPRINT` then, on every chunk, as OpenAI sends it."""

    system_fingerprint: str | None = Field(None, exclude_if=_absent)
    vision: VisionReport | None = Field(None, exclude_if=_absent)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    truncated_prompt_tokens: int | None = Field(
        None,
        exclude_if=_absent,
        description="Prompt tokens of earlier turns dropped to fit the context (context_overflow: truncate); "
        "only present when some were. prompt_tokens counts what the model read.",
    )


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None
    refusal: None = None


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = Field(None, exclude_if=_absent)


class Choice(BaseModel):
    index: int = 0
    message: ResponseMessage
    finish_reason: ChoiceFinish
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(_VisionFields):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[Choice]
    usage: Usage


class ToolCallDelta(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ToolCallFunction


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: ChoiceFinish | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(_VisionFields):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(BaseModel):
    """The legacy endpoint's logprobs: parallel lists, one entry per token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: FinishReason | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "mmserve"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body, for every 4xx and 5xx."""

    error: ErrorDetail


# --------------------------------------------------------------------------- between deployments


class ToolCallFunction(BaseModel):
    name: str
    arguments: str = Field(description="The arguments as JSON text, as OpenAI sends them.")


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class MessageText(BaseModel):
    """Native vision: a run of a message's text."""

    type: Literal["text"] = "text"
    text: str


class MessageImage(BaseModel):
    """Native vision: an image's place in a message; `index` is its position in `GenerateRequest.images`."""

    type: Literal["image"] = "image"
    index: int = Field(ge=0)


MessagePart = Annotated[MessageText | MessageImage, Field(discriminator="type")]


class TextMessage(BaseModel):
    """A chat message ready for a chat template: text only after proxy vision. An assistant message
    may carry the tool calls it made; a `tool` message answers the call `tool_call_id`.

    Native vision: a user message with images also has `parts`, its text runs and image slots in
    order (what a VLM's chat template renders); `content` is then its text alone."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    parts: list[MessagePart] | None = None


class GrammarSpec(BaseModel):
    """Constrained decoding: output that is a JSON object (`json_object`), or JSON valid against
    `json_schema` (the schema as JSON text)."""

    kind: Literal["json_object", "json_schema"]
    json_schema: str | None = None


class TopLogprob(BaseModel):
    token: str
    bytes: list[int]
    logprob: float


class TokenLogprob(TopLogprob):
    """One generated token: its text, UTF-8 bytes and log-probability, and the most likely tokens at
    its position (sorted, most likely first)."""

    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class GenerateRequest(BaseModel):
    """Ingress -> PrimaryDecoder. Unset sampling fields take the model's configured defaults.

    A chat is `messages` (rendered by the model's chat template, with `tools` when given); a legacy
    completion is `prompt`, text or token ids used as they are, with no template. Native vision: the
    checked, encoded bytes of the chat's images, sent once, which the messages' image slots name."""

    messages: list[TextMessage] = Field(default_factory=list)
    images: list[bytes] = Field(default_factory=list)
    prompt: str | list[int] | None = None
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None
    n: int = Field(1, ge=1, description="Independent sequences; the decoder replica runs each as its own.")
    logprobs: int | None = Field(
        None, ge=0, le=20, description="None: no logprobs; k: each token's logprob and the k most likely tokens."
    )
    logit_bias: dict[int, float] | None = None
    grammar: GrammarSpec | None = None


class GenerateChunk(BaseModel):
    """PrimaryDecoder -> Ingress, streamed. The last chunk of each sequence (`index`, 0 to n-1) has
    `finish_reason` set; `logprobs` covers the tokens whose text this chunk carries."""

    index: int = 0
    text: str = ""
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    truncated_prompt_tokens: int = 0  # prompt tokens dropped to fit the context, on the last chunk


class CaptionRequest(BaseModel):
    """Ingress -> VisionCaptioner: encoded image bytes (sent once) and one prompt per image."""

    images: list[bytes]
    prompts: list[str]


class ComponentStatus(BaseModel):
    """What a deployment says about itself on /health."""

    ready: bool
    model: str | None = None
    reason: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)

"""Wire schema: OpenAI chat-completions request/response models, and the small typed payloads the
deployments pass to each other through handles (never Starlette requests, PIL images or tensors).

Requests forbid unknown fields: an unsupported OpenAI feature is a 400 that names it rather than
being silently ignored. Harmless fields (`user`, `metadata`, `store`, ...) are accepted.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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


class AssistantMessage(_Request):
    role: Literal["assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    refusal: str | None = None


ChatMessage = Annotated[SystemMessage | UserMessage | AssistantMessage, Field(discriminator="role")]


class StreamOptions(_Request):
    include_usage: bool = False


StopString = Annotated[str, Field(min_length=1)]


class ChatCompletionRequest(_Request):
    model: str = Field(min_length=1)
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, gt=0)
    max_completion_tokens: int | None = Field(None, gt=0)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    stop: StopString | Annotated[list[StopString], Field(max_length=4)] | None = Field(
        None, description="Up to 4 non-empty sequences; generation stops before any of them."
    )
    seed: int | None = Field(None, ge=-(2**63), lt=2**63, description="A 64-bit integer.")
    n: int = Field(1, ge=1, le=1, description="Only n=1 is supported.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Harmless: accepted and ignored.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None

    @property
    def stop_sequences(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def completion_limit(self) -> int | None:
        """`max_completion_tokens` wins over the deprecated `max_tokens`."""
        return self.max_completion_tokens or self.max_tokens


# --------------------------------------------------------------------------- response


FinishReason = Literal["stop", "length"]

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


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: ResponseMessage
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletion(_VisionFields):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[Choice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(_VisionFields):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
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


class TextMessage(BaseModel):
    """A chat message after proxy vision: text only, ready for a chat template. An assistant message
    may carry the tool calls it made; a `tool` message answers the call `tool_call_id`."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


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
    completion is `prompt`, text or token ids used as they are, with no template."""

    messages: list[TextMessage] = Field(default_factory=list)
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

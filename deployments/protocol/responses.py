"""OpenAI's response bodies: completions and their stream chunks, with the service's `vision`
extension, the model list and the error body."""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, Field


class ToolCallFunction(BaseModel):
    name: str
    arguments: str = Field(description="The arguments as JSON text, as OpenAI sends them.")


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class TopLogprob(BaseModel):
    token: str
    bytes: list[int]
    logprob: float


class TokenLogprob(TopLogprob):
    """One generated token: its text, UTF-8 bytes and log-probability, and the most likely tokens at
    its position (sorted, most likely first)."""

    top_logprobs: list[TopLogprob] = Field(default_factory=list)


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


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(description="Prompt tokens read from the prefix cache (enable_prefix_caching).")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = Field(
        None, exclude_if=_absent, description="Present for an engine with a prefix cache (llama.cpp)."
    )
    truncated_prompt_tokens: int | None = Field(
        None,
        exclude_if=_absent,
        description="Prompt tokens of earlier turns dropped to fit the context (context_overflow: truncate); "
        "only present when some were. prompt_tokens counts what the model read.",
    )

    @classmethod
    def counted(cls, prompt: int, completion: int, truncated: int | None = None, cached: int | None = None) -> Usage:
        """Usage of `prompt` and `completion` tokens; `cached`: None for an engine with no prefix cache."""
        details = None if cached is None else PromptTokensDetails(cached_tokens=cached)
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            truncated_prompt_tokens=truncated,
            prompt_tokens_details=details,
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


class ToolCallDeltaFunction(BaseModel):
    """A call's first delta has its name (and the arguments so far); the next ones only arguments."""

    name: str | None = Field(None, exclude_if=_absent)
    arguments: str = ""


class ToolCallDelta(BaseModel):
    """One streamed piece of a tool call: the first names it (`id`, `type`, `function.name`), the
    next ones carry `function.arguments` fragments, as OpenAI and vLLM stream them."""

    index: int
    id: str | None = Field(None, exclude_if=_absent)
    type: Literal["function"] | None = Field(None, exclude_if=_absent)
    function: ToolCallDeltaFunction


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

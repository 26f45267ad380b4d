"""What OpenAI's API families share on the wire: the request base (unknown fields are refused, so an
unsupported feature is a 400 that names it rather than being silently ignored), the sampling fields,
content parts, function definitions, the `metadata` of a stored object; and on the way back: tool
calls, token logprobs, usage, the service's `vision` extension and the error body.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)


class RequestModel(BaseModel):
    """A request body or a part of one: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")


METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512  # OpenAI's bounds


def _bounded_metadata(metadata: dict[str, str]) -> dict[str, str]:
    """OpenAI's bounds: at most 16 pairs, keys of at most 64 characters, values of at most 512."""
    if len(metadata) > METADATA_PAIRS:
        raise ValueError(f"at most {METADATA_PAIRS} pairs; got {len(metadata)}")
    for key, value in metadata.items():
        if len(key) > METADATA_KEY_CHARS:
            raise ValueError(f"keys have at most {METADATA_KEY_CHARS} characters; {key[:16]!r}... has {len(key)}")
        if len(value) > METADATA_VALUE_CHARS:
            raise ValueError(f"values have at most {METADATA_VALUE_CHARS} characters; that of {key!r} has {len(value)}")
    return metadata


Metadata = Annotated[
    dict[str, str],
    AfterValidator(_bounded_metadata),
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": METADATA_PAIRS,
            "propertyNames": {"maxLength": METADATA_KEY_CHARS},
            "additionalProperties": {"type": "string", "maxLength": METADATA_VALUE_CHARS},
        }
    ),
]
"""A stored object's `metadata` (a batch's, a conversation's) within OpenAI's bounds, in the schema too."""


class ImageURL(RequestModel):
    """An image's URL (http(s), data or file) and the detail asked for."""

    url: str = Field(min_length=1)
    detail: Literal["auto", "low", "high"] = "auto"


class TextPart(RequestModel):
    """A text part of a message."""

    type: Literal["text"]
    text: str


class ImagePart(RequestModel):
    """An image part of a user message."""

    type: Literal["image_url"]
    image_url: ImageURL


class FileInput(RequestModel):
    """A document (PDF, plain text, Markdown, CSV) as chat's `file` part carries it: exactly one of
    `file_data` (a ``data:<media type>;base64,`` URL, as the openai clients send it), `file_id` (a
    /v1/files upload of the caller's) or `file_url` (an extension: Responses' `input_file.file_url`,
    fetched behind the image URLs' SSRF guard).
    """

    file_data: str | None = Field(None, min_length=1)
    file_id: str | None = Field(None, min_length=1)
    file_url: str | None = Field(None, min_length=1, description="Extension: an http(s) URL of the document.")
    filename: str | None = Field(None, max_length=512)

    @model_validator(mode="after")
    def _one_source(self) -> FileInput:
        given = [name for name in ("file_data", "file_id", "file_url") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"needs exactly one of file_data, file_id, file_url (got {', '.join(given) or 'none'})")
        return self


class FilePart(RequestModel):
    """A document in a user message; read into text (and page images) by the ingress's document stage."""

    type: Literal["file"]
    file: FileInput


class StreamOptions(RequestModel):
    """A stream's options: `include_usage` adds a last chunk with the usage."""

    include_usage: bool = False


StopString = Annotated[str, Field(min_length=1)]
LogitBias = dict[str, Annotated[float, Field(ge=-100, le=100)]]


class FunctionDefinition(RequestModel):
    """A function the model may call: its name, description and JSON-schema parameters."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class StructuredOutputs(RequestModel):
    """vLLM's `structured_outputs` extension: exactly one kind of constraint on the output. vLLM's
    other options of this object (`disable_fallback`, `disable_any_whitespace`,
    `disable_additional_properties`, `whitespace_pattern`, `structural_tag`) are not implemented and
    refused by name, as unknown fields are.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    json_: dict[str, Any] | bool | str | None = Field(
        None, alias="json", description="A JSON schema (an object, or its JSON text) the output is valid against."
    )
    regex: str | None = Field(None, min_length=1, description="A regular expression the whole output matches.")
    choice: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, min_length=1, description="The output is exactly one of these strings."
    )
    grammar: str | None = Field(
        None, min_length=1, description="A context-free grammar: Lark (llguidance's), or GBNF (`root ::= ...`)."
    )
    json_object: bool | None = Field(None, description="true: the output is a JSON object.")

    @model_validator(mode="after")
    def _one_kind(self) -> StructuredOutputs:
        kinds = self.kinds
        if len(kinds) != 1:
            named = ", ".join(kinds) or "none"
            raise ValueError(f"needs exactly one of json, regex, choice, grammar, json_object (got {named})")
        return self

    @property
    def kinds(self) -> list[str]:
        values = {"json": self.json_, "regex": self.regex, "choice": self.choice, "grammar": self.grammar}
        return [k for k, v in values.items() if v is not None] + (["json_object"] if self.json_object else [])


class SamplingFields(RequestModel):
    """What chat and legacy completions share, with vLLM's extensions to both (sent by the openai
    client through `extra_body`, so at the body's top level).
    """

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, gt=0)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, description="Extension (vLLM's): 0 or null for no top-k.")
    min_p: float | None = Field(
        None, ge=0, le=1, description="Extension (vLLM's): drop tokens below min_p times the top token's probability."
    )
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
    # vLLM's extensions.
    repetition_penalty: float | None = Field(
        None,
        gt=0,
        description="Extension (vLLM's): the multiplicative penalty of tokens in the prompt and the output so far "
        "(a positive logit divided by it, a negative one multiplied); 1 or null is off.",
    )
    min_tokens: int = Field(
        0,
        ge=0,
        description="Extension (vLLM's): end of sequence, stop_token_ids and stop strings ignored until this "
        "many tokens are generated.",
    )
    ignore_eos: bool = Field(False, description="Extension (vLLM's): the end of sequence never ends the answer.")
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        None, description="Extension (vLLM's): token ids that end the answer, like the end of sequence."
    )
    skip_special_tokens: bool = Field(True, description="Extension (vLLM's): false keeps special tokens in the text.")
    include_stop_str_in_output: bool = Field(
        False, description="Extension (vLLM's): the stop string or stop token that ended the answer kept in its text."
    )
    structured_outputs: StructuredOutputs | None = Field(
        None, description="Extension (vLLM's): constrained output (json, regex, choice, grammar, json_object)."
    )
    priority: int = Field(
        0,
        ge=-(2**31),
        lt=2**31,
        description="Extension (vLLM's): admission order when requests wait; lower first, first come first served "
        "among equals.",
    )
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

    @model_validator(mode="after")
    def _min_tokens_within_max_tokens(self) -> SamplingFields:
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be at most max_tokens ({self.max_tokens})")
        return self

    @property
    def include_usage(self) -> bool:
        """A stream ends with a chunk of the usage (`stream_options.include_usage`)."""
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def stop_sequences(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ToolCallFunction(BaseModel):
    """The function a tool call calls, and its arguments."""

    name: str
    arguments: str = Field(description="The arguments as JSON text, as OpenAI sends them.")


class ToolCall(BaseModel):
    """A tool call of the answer."""

    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class TopLogprob(BaseModel):
    """One of the likeliest tokens at a position, with its logprob."""

    token: str
    bytes: list[int]
    logprob: float


class TokenLogprob(TopLogprob):
    """One generated token: its text, UTF-8 bytes and log-probability, and the most likely tokens at
    its position (sorted, most likely first).
    """

    top_logprobs: list[TopLogprob] = Field(default_factory=list)


FinishReason = Literal["stop", "length"]

UnseenReason = Literal["captioner_unavailable", "captioner_timeout"]
PageUnseenReason = Literal[
    "truncated", "vision_disabled", "over_image_limit", "not_rendered", "captioner_unavailable", "captioner_timeout"
]

DEGRADED_FINGERPRINT = "mmserve-vision-degraded"


class UnseenImage(BaseModel):
    """One image the decoder was told about but that no caption describes."""

    index: int = Field(description="Position among the request's images, 0-based, in conversation order.")
    reason: UnseenReason = Field(
        description="captioner_unavailable: it failed to load, died, or failed recently; "
        "captioner_timeout: it did not answer within proxy_vision.timeout_s."
    )
    message: str = Field(description="What the ingress knows of the cause, in words.")


class UnseenPage(BaseModel):
    """A page of a request's document that the decoder did not read or see."""

    document: int = Field(description="Position among the request's documents, 0-based, in conversation order.")
    filename: str = Field(description="The document's name, as the prompt names it.")
    page: int = Field(description="The page, 1-based (a text document's part).")
    reason: PageUnseenReason = Field(
        description="truncated: left out beyond documents.max_chars_per_request; vision_disabled: a page without "
        "text, and the model takes no images; over_image_limit: a page without text beyond the request's image "
        "limits; not_rendered: beyond documents.max_rendered_pages; captioner_unavailable / captioner_timeout: "
        "its image could not be captioned."
    )


def _empty(value: object) -> bool:
    return not value


class VisionReport(BaseModel):
    """Which images, and which pages of documents, the decoder did not see, and why."""

    degraded: Literal[True] = True
    unseen_images: list[UnseenImage] = Field(default_factory=list)
    unseen_pages: list[UnseenPage] = Field(default_factory=list, exclude_if=_empty)

    @model_validator(mode="after")
    def _something_unseen(self) -> VisionReport:
        if not self.unseen_images and not self.unseen_pages:
            raise ValueError("a report names at least one unseen image or page")
        return self


def absent(value: object) -> bool:
    """Whether an optional field is left out of the JSON (`exclude_if`): it is when None."""
    return value is None


class VisionFields(BaseModel):
    """What a response says when an image was not seen; both fields are absent when every image was.

    `vision` is a top-level extension field because the official openai client keeps unknown
    top-level fields (`completion.vision`, `completion.model_extra`); on a stream it is on the first
    chunk. LangChain's ChatOpenAI drops unknown fields at every level, but keeps
    `system_fingerprint` in the message's `response_metadata` (on a stream, from the chunk with
    the finish reason): OpenAI defines it as the backend configuration that produced the answer,
    and an answer produced without the captioner comes from a different one, so it is
    `DEGRADED_FINGERPRINT` then, on every chunk, as OpenAI sends it.
    """

    system_fingerprint: str | None = Field(None, exclude_if=absent)
    vision: VisionReport | None = Field(None, exclude_if=absent)


class PromptTokensDetails(BaseModel):
    """What the prompt's tokens were made of: those read from the prefix cache."""

    cached_tokens: int = Field(description="Prompt tokens read from the prefix cache (enable_prefix_caching).")


class Usage(BaseModel):
    """The tokens of a request: the prompt's and the answer's."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = Field(
        None, exclude_if=absent, description="Present for an engine with a prefix cache (llama.cpp)."
    )
    truncated_prompt_tokens: int | None = Field(
        None,
        exclude_if=absent,
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


class ErrorDetail(BaseModel):
    """An error's message, type, param and code, as OpenAI's body carries them."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body, for every 4xx and 5xx."""

    error: ErrorDetail

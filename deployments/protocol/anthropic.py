"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens): the request (a `system`
prompt, user and assistant turns of content blocks: text, images by base64 or URL, documents (PDF or
plain text, by base64, text, URL or file id; also inside a tool result), `tool_use` and
`tool_result`; `system` turns among them, as Claude Code sends; custom tools with their
`input_schema`, `tool_choice`), the `message` answer and the error body.

Unknown fields are refused (a 400 naming them), and so are the fields this server does not honour
(server tools, MCP servers, containers). Set aside, accepted without effect: `cache_control` marks
and `metadata` (the prefix cache needs no marks), `thinking` (the models do not reason: no thinking
blocks come back, and an earlier answer's thinking blocks sent back are dropped),
`context_management` (its edits clear thinking or old tool results, of which the prompt then keeps
all), `output_config.effort`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator

from deployments.protocol.openai.common import RequestModel, VisionReport, absent

CacheControl = dict[str, Any]  # {"type": "ephemeral", "ttl": ...}: accepted, ignored


class TextBlock(RequestModel):
    """A text block (`cache_control` and `citations` accepted, set aside)."""

    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[dict[str, Any]] | None = None


class Base64Source(RequestModel):
    """An image's bytes as base64, of one of the four media types Anthropic takes."""

    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str = Field(min_length=1)


class URLSource(RequestModel):
    """An image or a document by URL, fetched behind the SSRF guard."""

    type: Literal["url"]
    url: str = Field(min_length=1)


class ImageBlock(RequestModel):
    """An image block: its source by base64 or URL."""

    type: Literal["image"]
    source: Annotated[Base64Source | URLSource, Field(discriminator="type")]
    cache_control: CacheControl | None = None

    @property
    def url(self) -> str:
        """The image as the vision pipeline fetches it: a data URL, or the URL (its SSRF guard)."""
        source = self.source
        return f"data:{source.media_type};base64,{source.data}" if isinstance(source, Base64Source) else source.url


class PdfSource(RequestModel):
    """A PDF's bytes as base64."""

    type: Literal["base64"]
    media_type: Literal["application/pdf"]
    data: str = Field(min_length=1)


class PlainTextSource(RequestModel):
    """A plain-text document given inline."""

    type: Literal["text"]
    media_type: Literal["text/plain"] = "text/plain"
    data: str


class ContentSource(RequestModel):
    """A document given as content blocks (its text blocks are the document's text)."""

    type: Literal["content"]
    content: str | list[TextBlock]


class FileIdSource(RequestModel):
    """A document uploaded to /v1/files, by its id."""

    type: Literal["file"]
    file_id: str = Field(min_length=1)


DocumentSource = Annotated[
    PdfSource | PlainTextSource | URLSource | ContentSource | FileIdSource, Field(discriminator="type")
]


class DocumentBlock(RequestModel):
    """A document (a PDF, plain text, a URL of either): read into text by the ingress for any model,
    as it reads a `file` part of a chat (docs/documents.md). `title` names it in the prompt, `context`
    goes before it; `citations` are accepted and set aside (no citations come back).
    """

    type: Literal["document"]
    source: DocumentSource
    title: str | None = Field(None, max_length=500)
    context: str | None = None
    citations: dict[str, Any] | None = None
    cache_control: CacheControl | None = None


class ToolUseBlock(RequestModel):
    """An earlier answer's tool call, sent back in an assistant turn: its id, name and input."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ThinkingBlock(RequestModel):
    """An earlier answer's thinking, sent back: dropped (this server's models write none)."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None
    cache_control: CacheControl | None = None


class RedactedThinkingBlock(RequestModel):
    """An earlier answer's redacted thinking, sent back: accepted and dropped."""

    type: Literal["redacted_thinking"]
    data: str
    cache_control: CacheControl | None = None


ResultPart = Annotated[TextBlock | ImageBlock | DocumentBlock, Field(discriminator="type")]


class ToolResultBlock(RequestModel):
    """A tool's result in a user turn, answering its `tool_use_id` (text, images or documents)."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[ResultPart] = ""
    is_error: bool = False
    cache_control: CacheControl | None = None


UserBlock = Annotated[TextBlock | ImageBlock | DocumentBlock | ToolResultBlock, Field(discriminator="type")]
AssistantBlock = Annotated[
    TextBlock | ToolUseBlock | ThinkingBlock | RedactedThinkingBlock, Field(discriminator="type")
]


class UserTurn(RequestModel):
    """A user turn: a string or content blocks."""

    role: Literal["user"]
    content: str | Annotated[list[UserBlock], Field(min_length=1)]


class AssistantTurn(RequestModel):
    """An assistant turn: a string or content blocks (text, tool calls, thinking sent back)."""

    role: Literal["assistant"]
    content: str | Annotated[list[AssistantBlock], Field(min_length=1)]


class SystemTurn(RequestModel):
    """A system message among the turns (Claude Code's mid-conversation system messages): its text is
    added to the system prompt, in order.
    """

    role: Literal["system"]
    content: str | Annotated[list[TextBlock], Field(min_length=1)]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "\n".join(block.text for block in self.content)


InputMessage = Annotated[UserTurn | AssistantTurn | SystemTurn, Field(discriminator="role")]


class CustomTool(RequestModel):
    """A custom (client) tool; server tools (web search, code execution, ...) are not served here."""

    type: Literal["custom"] | None = None
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: CacheControl | None = None
    # Accepted, set aside: every tool is offered at once, its input streamed as it is written.
    defer_loading: bool | None = None
    eager_input_streaming: bool | None = None
    strict: bool | None = None
    input_examples: list[dict[str, Any]] | None = None


class ThinkingConfig(RequestModel):
    """`thinking`: accepted, set aside (the models do not reason; no thinking blocks come back)."""

    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = Field(None, ge=0)
    display: str | None = None


class OutputConfig(RequestModel):
    """`output_config`: its `effort` accepted and set aside (the model's answer is as long as it is)."""

    effort: Literal["low", "medium", "high", "max"] | None = None


class AutoChoice(RequestModel):
    """The model may call a tool or answer."""

    type: Literal["auto"]
    disable_parallel_tool_use: bool = False


class AnyChoice(RequestModel):
    """The model must call one of the tools."""

    type: Literal["any"]
    disable_parallel_tool_use: bool = False


class NamedChoice(RequestModel):
    """The model must call the tool it names."""

    type: Literal["tool"]
    name: str = Field(min_length=1)
    disable_parallel_tool_use: bool = False


class NoneChoice(RequestModel):
    """The model must not call a tool."""

    type: Literal["none"]


ToolChoice = Annotated[AutoChoice | AnyChoice | NamedChoice | NoneChoice, Field(discriminator="type")]

# Anthropic fields this server does not honour: a 400 that names the field, never silently ignored.
UNSUPPORTED_MESSAGES_FIELDS = ("mcp_servers", "container")


class MessagesInput(RequestModel):
    """What /v1/messages/count_tokens takes: a Messages request, `max_tokens` optional (the
    generation settings are accepted there and do not change the count).
    """

    model: str = Field(min_length=1)
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[CustomTool] | None = Field(None, max_length=128)
    tool_choice: ToolChoice | None = None
    max_tokens: int | None = Field(None, gt=0)
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = Field(None, max_length=16)
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    # Harmless: accepted and ignored.
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    # Set aside: accepted, without effect on models that do not reason (see the module's docstring).
    thinking: ThinkingConfig | None = None
    context_management: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
    # Declared (null only) so that the 400 names them and the OpenAPI spec says so.
    mcp_servers: None = None
    container: None = None

    @field_validator(*UNSUPPORTED_MESSAGES_FIELDS, mode="before")
    @classmethod
    def _unsupported(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError("not supported by this server")
        return value


class MessagesRequest(MessagesInput):
    """POST /v1/messages: `max_tokens` is required."""

    max_tokens: int = Field(gt=0)


StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class TextContent(BaseModel):
    """A text block of the answer."""

    type: Literal["text"] = "text"
    text: str


class ToolUseContent(BaseModel):
    """A tool call of the answer: its id, name and input."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class MessageUsage(BaseModel):
    """The answer's usage in Anthropic's words (prompt tokens read from the prefix cache apart)."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = Field(0, description="Input tokens read from the prefix cache.")
    cache_creation_input_tokens: int = Field(0, description="Always 0: the prefix cache is written for free.")


class Message(BaseModel):
    """The answer of /v1/messages; `vision` (this service's extension, as on a chat completion)
    names the images the model did not see.
    """

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextContent | ToolUseContent]
    stop_reason: StopReason | None
    stop_sequence: str | None = None
    usage: MessageUsage
    vision: VisionReport | None = Field(None, exclude_if=absent)


class TokenCount(BaseModel):
    """The answer of /v1/messages/count_tokens."""

    input_tokens: int


class AnthropicErrorDetail(BaseModel):
    """The error's type and message, as Anthropic's body carries them."""

    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Anthropic's error body, for every 4xx and 5xx of /v1/messages."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail

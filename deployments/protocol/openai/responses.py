"""OpenAI's Responses API (/v1/responses): the request (input as a string or items: messages,
function calls and their outputs; flat function tools and `namespace` groups of them; `text.format`).
The `response` object that answers it is in `objects`.

Hosted tools (web search and the like, which only OpenAI's servers run) are set aside: not offered
to the model, named in the reply's `X-Tools-Set-Aside` header and the access log; a `tool_choice`
that forces one is a 400. `reasoning` and `include: ["reasoning.encrypted_content"]` are accepted on
models that do not reason (no reasoning items). Background runs and the other fields this server
does not honour are 400s that name them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationInfo, field_validator

from deployments.protocol.openai.common import RequestModel
from deployments.protocol.openai.items import (
    CompactionItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputItem,
    MessageItem,
)


class FunctionTool(RequestModel):
    """A function tool in the Responses API's flat shape."""

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamespaceTool(RequestModel):
    """A group of function tools under one name (the Codex CLI's MCP servers and agent tools): each
    function is offered to the model, and a call of one names it and its `namespace` apart.
    """

    type: Literal["namespace"]
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    tools: list[FunctionTool] = Field(max_length=128)


class HostedTool(BaseModel):
    """A tool that OpenAI's servers run (`web_search`, `file_search`, `code_interpreter`, `mcp`,
    `image_generation`, `local_shell`, `custom`, ...): kept as it came, set aside (not offered).
    """

    model_config = ConfigDict(extra="allow")

    type: str


def _tool_type(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in ("function", "namespace") else "hosted"


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[NamespaceTool, Tag("namespace")]
    | Annotated[HostedTool, Tag("hosted")],
    Discriminator(_tool_type),
]


class NamedFunctionChoice(RequestModel):
    """A `tool_choice` that forces one function."""

    type: Literal["function"]
    name: str = Field(min_length=1)


ToolChoice = Literal["none", "auto", "required"] | NamedFunctionChoice


class TextFormatText(RequestModel):
    """Plain text (the default format)."""

    type: Literal["text"]


class TextFormatJsonObject(RequestModel):
    """Any JSON object."""

    type: Literal["json_object"]


class TextFormatJsonSchema(RequestModel):
    """JSON that matches the given schema."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)

    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64)
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


TextFormat = Annotated[TextFormatText | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")]


class ReasoningParam(RequestModel):
    """Accepted and set aside: the served models do not reason, so no reasoning items come back."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed", "none"] | None = None
    generate_summary: Literal["auto", "concise", "detailed", "none"] | None = None


class TextConfig(RequestModel):
    """The answer's text: its format (and a verbosity, set aside)."""

    format: TextFormat = Field(default_factory=lambda: TextFormatText(type="text"))
    verbosity: Literal["low", "medium", "high"] | None = Field(
        None, description="Accepted and set aside: the length is the model's (and max_output_tokens')."
    )


# `include` values that ask for data of items this server never produces (reasoning, hosted tools'
# calls): accepted, with nothing to include.
Includable = Literal[
    "reasoning.encrypted_content",
    "web_search_call.action.sources",
    "web_search_call.results",
    "file_search_call.results",
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "message.input_image.image_url",
]
INCLUDABLE = get_args(Includable)


# Fields of OpenAI's request that this server does not honour: a 400 that names the field when set.
UNSUPPORTED_RESPONSE_FIELDS = (
    "prompt",
    "max_tool_calls",
    "top_logprobs",
    "context_management",
    "moderation",
    "background_options",
)

_HOSTED = (
    "forces a tool that this server cannot run: only function tools (and namespaces of them) are run here; "
    "hosted tools (web search, file search, code interpreter, computer use, MCP, image generation, shell, "
    "custom) are set aside"
)


class ConversationRef(RequestModel):
    """A conversation by id, as `conversation` may give it."""

    id: str = Field(min_length=1)


class ResponseRequest(RequestModel):
    """The create body of /v1/responses."""

    model: str = Field(min_length=1)
    input: Annotated[str, Field(min_length=1)] | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_output_tokens: int | None = Field(None, gt=0)
    metadata: dict[str, str] | None = Field(None, max_length=16)
    user: str | None = None
    stream: bool = False
    store: bool = Field(True, description="Keep the response for `previous_response_id` and GET (as OpenAI's default).")
    previous_response_id: str | None = None
    background: Literal[False] | None = Field(None, description="Only false: background runs are not supported.")
    include: list[Includable] | None = Field(
        None,
        description="Only data of items this server never produces (reasoning.encrypted_content, hosted tools' "
        "calls): accepted, nothing to include.",
    )
    reasoning: ReasoningParam | None = Field(
        None, description="Accepted and set aside: the models do not reason (no reasoning items)."
    )
    truncation: Literal["disabled"] | None = Field(
        None, description="Only disabled: the model's `context_overflow` setting decides what a long input gets."
    )
    stream_options: dict[str, Any] | None = None
    # Harmless: accepted and ignored.
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    client_metadata: dict[str, Any] | None = Field(None, description="The client's own notes: accepted, ignored.")
    conversation: str | ConversationRef | None = Field(
        None,
        description="The conversation (/v1/conversations, the caller's) this response belongs to: its items come "
        "before the input, and the input and output are added to it once the response completes. Not with "
        "previous_response_id.",
    )
    # Declared (null only) so that the 400 names them (UNSUPPORTED_RESPONSE_FIELDS).
    prompt: None = None
    max_tool_calls: None = None
    top_logprobs: None = None
    context_management: None = None
    moderation: None = None
    background_options: None = None

    @field_validator(*UNSUPPORTED_RESPONSE_FIELDS, mode="before")
    @classmethod
    def _unsupported(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError("not supported by this server")
        return value

    @field_validator("conversation")
    @classmethod
    def _not_with_previous_response(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and info.data.get("previous_response_id") is not None:
            raise ValueError(
                "Mutually exclusive parameters: Ensure you are only providing one of: 'previous_response_id' or "
                "'conversation'."
            )
        return value

    @property
    def conversation_id(self) -> str | None:
        return self.conversation.id if isinstance(self.conversation, ConversationRef) else self.conversation

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _function_choice_only(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("type") != "function":
            raise ValueError(f"a tool choice of type {value.get('type')!r}: {_HOSTED}")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_names_a_tool(cls, value: Any, info: ValidationInfo) -> Any:
        tools = [tool for tool in info.data.get("tools") or [] if not isinstance(tool, HostedTool)]
        if (value == "required" or isinstance(value, NamedFunctionChoice)) and not tools:
            raise ValueError("needs tools (function tools: hosted tools are set aside)")
        names = {tool.name for tool in tools if isinstance(tool, FunctionTool)}
        if isinstance(value, NamedFunctionChoice) and value.name not in names:
            raise ValueError(f"names the function {value.name!r}, which is not in tools")
        return value

    # Before the types are checked, so that the 400 says why rather than which values the schema allows.
    @field_validator("background", mode="before")
    @classmethod
    def _no_background(cls, value: Any) -> Any:
        if value is True:
            raise ValueError("background runs are not supported by this server")
        return value

    @field_validator("include", mode="before")
    @classmethod
    def _includable(cls, value: Any) -> Any:
        if unknown := [str(v) for v in value if v not in INCLUDABLE] if isinstance(value, list) else []:
            raise ValueError(f"{', '.join(unknown)}: not supported by this server (no such output data)")
        return value

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, value: dict[str, Any] | None, info: ValidationInfo) -> Any:
        if value is not None and not info.data.get("stream"):
            raise ValueError("only allowed when stream is true")
        return value

    @property
    def set_aside(self) -> list[str]:
        """The types of the hosted tools that are set aside (not offered to the model), in order, once each."""
        kinds = [tool.type for tool in self.tools or [] if isinstance(tool, HostedTool)]
        return list(dict.fromkeys(kinds))

    @property
    def items(self) -> list[MessageItem | FunctionCallItem | FunctionCallOutputItem | CompactionItem]:
        """The input as items (a string is one user message)."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)


class ResponseCreateEvent(ResponseRequest):
    """A turn of the WebSocket mode (`response.create`): the create body and its `type`. Every turn
    streams its events on the socket, so the HTTP transport's `stream`, `stream_options` and
    `background` are not sent.
    """

    type: Literal["response.create"]

    @field_validator("stream", "stream_options", "background", mode="before")
    @classmethod
    def _not_in_websocket_mode(cls, value: Any) -> Any:
        raise ValueError("not sent in WebSocket mode (every turn streams its events on the socket)")

    def request(self) -> ResponseRequest:
        """The turn as the create body (streamed)."""
        return ResponseRequest.model_validate(
            {**self.model_dump(exclude={"type"}, exclude_unset=True, by_alias=True), "stream": True}
        )

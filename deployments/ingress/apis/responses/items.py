"""A Responses request as the decoder takes it: its input items (after the earlier responses' items
when it continues one, `previous_response_id`) become chat messages, which the vision pipeline and
the chat template take like any chat, and its tools, tool choice and `text.format` become the tool
plan and the grammar.

- `instructions` is the first message (system); it is never carried over from an earlier response.
- A message's `input_text`/`output_text` parts are text, its `input_image` parts images (those of a
  system, developer or assistant message follow it in a user turn: only a user turn has images).
- `function_call` items are the tool calls of an assistant message (the one right before them when
  it has none yet); a `function_call_output` is a tool message with the output's text, and the
  images of outputs (a screenshot from a computer-use tool) follow the tool messages as a user
  turn, so that they reach the decoder as any image does.
- A `compaction` item (the summary that /v1/responses/compact wrote) is an assistant message that
  gives the summary of the conversation before it.
- A `function_call_output` answers a `function_call` earlier in the conversation (`call_id`);
  one that answers none is a 400, as OpenAI's.
- A `namespace` tool's functions are offered to the model under one flat name each,
  ``<namespace>__<name>`` (``<namespace><name>`` when the namespace ends in ``_``, as Codex's MCP
  namespaces ``mcp__server__`` do); a call of one is a `function_call` with the function's own
  `name` and its `namespace` (the shape Codex's `ResponseItem::FunctionCall` reads), and such a
  call sent back as input is the flat name again (`Namespaces`).
- Every item is stored as it came (`stored_item`), with an id, and an answer's output items become
  input items again (`as_input`) for a later response that continues it.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from deployments.errors import InvalidRequestError
from deployments.protocol.openai.chat import (
    AssistantMessage,
    ChatMessage,
    FunctionCallParam,
    SystemMessage,
    ToolCallParam,
    ToolMessage,
    UserMessage,
)
from deployments.protocol.openai.common import FileInput, FilePart, FunctionDefinition, ImagePart, ImageURL, TextPart
from deployments.protocol.openai.items import (
    CompactionItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputFile,
    InputImage,
    InputText,
    MessageItem,
    kept_item,
)
from deployments.protocol.openai.responses import (
    FunctionTool,
    NamedFunctionChoice,
    NamespaceTool,
    ResponseRequest,
    TextFormatJsonObject,
    TextFormatJsonSchema,
)
from deployments.protocol.replica import GrammarSpec
from deployments.tools.plan import ToolPlan, plan_tools

Item = MessageItem | FunctionCallItem | FunctionCallOutputItem | CompactionItem

SUMMARY_INTRO = "Summary of our conversation so far:"


def flat_name(namespace: str, name: str) -> str:
    """A namespaced function's name as the model sees it: a function name (64 characters at most, of
    letters, digits, ``_`` and ``-``; a longer one keeps its first 55 and a digest of the whole).
    """
    flat = re.sub(r"[^a-zA-Z0-9_-]", "_", f"{namespace}{name}" if namespace.endswith("_") else f"{namespace}__{name}")
    return flat if len(flat) <= 64 else f"{flat[:55]}_{hashlib.sha256(flat.encode()).hexdigest()[:8]}"


class Namespaces:
    """The request's `namespace` tools: each function's flat name (as the model sees it) and back."""

    def __init__(self, body: ResponseRequest) -> None:
        self.functions: dict[str, tuple[str, str]] = {}  # flat name -> (namespace, name)
        for tool in body.tools or []:
            if isinstance(tool, NamespaceTool):
                for function in tool.tools:
                    self.functions[flat_name(tool.name, function.name)] = (tool.name, function.name)

    def split(self, name: str) -> tuple[str | None, str]:
        """A called function's `(namespace, name)`; a plain function has no namespace."""
        return self.functions.get(name, (None, name))


def chat_messages(body: ResponseRequest, earlier: list[Item]) -> list[ChatMessage]:
    """The chat of `instructions`, the `earlier` items and the request's own."""
    _check_call_outputs(earlier, body.items)
    messages: list[ChatMessage] = []
    if body.instructions:
        messages.append(SystemMessage(role="system", content=body.instructions))
    images: list[Shown] = []  # of tool outputs, sent once the run of tool messages ends
    for item in [*earlier, *body.items]:
        if images and not isinstance(item, FunctionCallOutputItem):
            messages.append(_images_turn(images, tools=isinstance(messages[-1], ToolMessage)))
            images = []
        if isinstance(item, MessageItem):
            message, shown = _message(item)
            messages.append(message)
            images += shown
        elif isinstance(item, FunctionCallItem):
            _add_call(messages, item)
        elif isinstance(item, CompactionItem):
            messages.append(AssistantMessage(role="assistant", content=f"{SUMMARY_INTRO} {item.encrypted_content}"))
        else:
            text, shown = _output(item)
            messages.append(ToolMessage(role="tool", content=text, tool_call_id=item.call_id))
            images += shown
    if images:
        messages.append(_images_turn(images, tools=isinstance(messages[-1], ToolMessage)))
    return messages


def _check_call_outputs(earlier: list[Item], items: list[Item]) -> None:
    """Each function call output of the request answers a call before it in the conversation."""
    calls = {item.call_id for item in earlier if isinstance(item, FunctionCallItem)}
    for index, item in enumerate(items):
        if isinstance(item, FunctionCallItem):
            calls.add(item.call_id)
        elif isinstance(item, FunctionCallOutputItem) and item.call_id not in calls:
            raise InvalidRequestError(
                f"No tool call found for function call output with call_id {item.call_id!r}.",
                param=f"input[{index}].call_id",
            )


def _image(part: InputImage) -> ImagePart:
    detail = "high" if part.detail == "original" else part.detail
    return ImagePart(type="image_url", image_url=ImageURL(url=part.image_url, detail=detail))


def _file(part: InputFile) -> FilePart:
    source = FileInput(file_data=part.file_data, file_id=part.file_id, file_url=part.file_url, filename=part.filename)
    return FilePart(type="file", file=source)


Shown = ImagePart | FilePart


def _message(item: MessageItem) -> tuple[ChatMessage, list[Shown]]:
    """A message item as a chat message; a user's images and documents stay in place, those of other
    roles (which a chat template gives no image slot) come back to follow it in a user turn.
    """
    if isinstance(item.content, str):
        parts: list[TextPart | Shown] = [TextPart(type="text", text=item.content)]
    else:
        parts = []
        for part in item.content:
            if isinstance(part, InputImage):
                parts.append(_image(part))
            elif isinstance(part, InputFile):
                parts.append(_file(part))
            else:
                parts.append(TextPart(type="text", text=part.text if part.type != "refusal" else part.refusal))
    if item.role == "user":
        return UserMessage(role="user", content=parts if not isinstance(item.content, str) else item.content), []
    text = "".join(part.text for part in parts if isinstance(part, TextPart))
    images = [part for part in parts if isinstance(part, ImagePart | FilePart)]
    if item.role == "assistant":
        return AssistantMessage(role="assistant", content=text), images
    return SystemMessage(role="system" if item.role == "system" else "developer", content=text), images


def _add_call(messages: list[ChatMessage], item: FunctionCallItem) -> None:
    name = flat_name(item.namespace, item.name) if item.namespace else item.name
    call = ToolCallParam(id=item.call_id, function=FunctionCallParam(name=name, arguments=item.arguments))
    last = messages[-1] if messages else None
    if isinstance(last, AssistantMessage):  # the calls of the text before them, or more calls of one turn
        last.tool_calls = [*(last.tool_calls or []), call]
    else:
        messages.append(AssistantMessage(role="assistant", content=None, tool_calls=[call]))


def _output(item: FunctionCallOutputItem) -> tuple[str, list[Shown]]:
    """A tool output's text, and its images and documents (which follow in a user turn)."""
    if isinstance(item.output, str):
        return item.output, []
    text = "".join(part.text for part in item.output if isinstance(part, InputText))
    shown: list[Shown] = [
        _image(part) if isinstance(part, InputImage) else _file(part)
        for part in item.output
        if isinstance(part, InputImage | InputFile)
    ]
    return text or ("(attached below)" if shown else ""), shown


def _images_turn(images: list[Shown], tools: bool) -> UserMessage:
    what = "images" if all(isinstance(part, ImagePart) for part in images) else "attachments"
    said = f"The {what} that the tool results above returned:" if tools else f"The {what} of the message above:"
    intro = TextPart(type="text", text=said)
    return UserMessage(role="user", content=[intro, *images])


def tool_plan(body: ResponseRequest) -> ToolPlan:
    """The plan of the request's `tools` (function tools, and each function of a namespace under its
    flat name; hosted tools set aside), `tool_choice` and `parallel_tool_calls`.
    """
    choice = body.tool_choice
    functions: list[FunctionDefinition] = []
    for tool in body.tools or []:
        if isinstance(tool, FunctionTool):
            functions.append(_function(tool))
        elif isinstance(tool, NamespaceTool):
            functions += [_function(f, flat_name(tool.name, f.name)) for f in tool.tools]
    formatted = body.text is not None and body.text.format.type != "text"
    return plan_tools(
        functions,
        None if isinstance(choice, NamedFunctionChoice) else choice,
        function=choice.name if isinstance(choice, NamedFunctionChoice) else None,
        parallel=body.parallel_tool_calls,
        constrained_by="text.format" if formatted else None,
    )


def _function(tool: FunctionTool, name: str | None = None) -> FunctionDefinition:
    definition = FunctionDefinition.model_validate(tool.model_dump(exclude={"type"}, exclude_none=True))
    return definition if name is None else definition.model_copy(update={"name": name})


def text_grammar(body: ResponseRequest, plan: ToolPlan) -> GrammarSpec | None:
    """The grammar of `text.format` (json_object, json_schema), or that of the tool plan."""
    fmt = body.text.format if body.text is not None else None
    if isinstance(fmt, TextFormatJsonObject):
        return GrammarSpec(kind="json_object")
    if isinstance(fmt, TextFormatJsonSchema):
        return GrammarSpec(kind="json_schema", json_schema=json.dumps(fmt.schema_))
    return plan.grammar


def stored_item(item: Item) -> dict[str, Any]:
    """An input item as it is kept and listed: as it came, with an id (and a message's text content
    as one part, as OpenAI lists it).
    """
    return kept_item(item.model_dump(exclude_none=True, by_alias=True))


def continued(item: dict[str, Any]) -> dict[str, Any]:
    """A kept item (a conversation's: input or output) as the input item that continues it."""
    if item.get("type") == "function_call" or (item.get("type") == "message" and item.get("role") == "assistant"):
        return as_input(item) if isinstance(item.get("content", []), list) else item
    return item


def as_input(output: dict[str, Any]) -> dict[str, Any]:
    """An output item (message or function call) as the input item that continues the conversation."""
    if output["type"] == "message":
        content = [
            {"type": "output_text", "text": part["text"]} if "text" in part else part for part in output["content"]
        ]
        return {"type": "message", "role": "assistant", "content": content, "id": output["id"]}
    return {key: output[key] for key in ("type", "call_id", "name", "namespace", "arguments", "id") if key in output}

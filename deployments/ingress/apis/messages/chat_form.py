"""A Messages request in the chat form that the rest of the service takes (the vision pipeline, the
tool plan, the decoder's chat template), so that /v1/messages keeps chat's promises by using chat's
path rather than a copy of it.

Block by block:

- `system` (a string or text blocks) is a system message, and the text of each `system` turn among
  the messages (Claude Code's) is added to it, in order: chat templates take one system message,
  first;
- a user turn's `tool_result` blocks are `tool` messages, in order, each answering its `tool_use_id`
  (an error result's text starts with ``Error:``); the images and documents of tool results (how an
  agent hands back a PDF it opened), and the turn's own text, images and documents, follow as one
  user message (where the image pipeline and the document stage see them); a document is chat's
  `file` part, its `context` a text part before it;
- an assistant turn's text is its content and its `tool_use` blocks its tool calls (the input as
  JSON text); its thinking blocks (an earlier model's) are dropped;
- `tools` are function definitions (`input_schema` the parameters), `tool_choice` the plan's choice.
"""

from __future__ import annotations

import base64
import json
from typing import Literal

from deployments.protocol.anthropic import (
    AnyChoice,
    AssistantTurn,
    ContentSource,
    DocumentBlock,
    FileIdSource,
    ImageBlock,
    MessagesInput,
    NamedChoice,
    NoneChoice,
    PdfSource,
    PlainTextSource,
    SystemTurn,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    URLSource,
    UserTurn,
)
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

ERROR_PREFIX = "Error: "


def chat_messages(body: MessagesInput) -> list[ChatMessage]:
    """The request's system prompt and turns as chat messages."""
    chat: list[ChatMessage] = []
    system = body.system if isinstance(body.system, str) else " ".join(block.text for block in body.system or [])
    turns = [message.text for message in body.messages if isinstance(message, SystemTurn)]
    if system := "\n\n".join(text for text in [system, *turns] if text):
        chat.append(SystemMessage(role="system", content=system))
    for message in body.messages:
        if isinstance(message, AssistantTurn):
            chat += _assistant(message)
        elif isinstance(message, UserTurn):
            chat += _user(message)
    return chat


def _user(message: UserTurn) -> list[ChatMessage]:
    if isinstance(message.content, str):
        return [UserMessage(role="user", content=message.content)]
    chat: list[ChatMessage] = []
    parts: list[TextPart | ImagePart | FilePart] = []
    for block in message.content:
        if isinstance(block, ToolResultBlock):
            chat.append(ToolMessage(role="tool", content=_result_text(block), tool_call_id=block.tool_use_id))
            for part in _result_parts(block):
                if isinstance(part, ImageBlock):
                    parts.append(_image(part))
                elif isinstance(part, DocumentBlock):
                    parts += _document(part)
        elif isinstance(block, TextBlock):
            parts.append(TextPart(type="text", text=block.text))
        elif isinstance(block, DocumentBlock):
            parts += _document(block)
        else:
            parts.append(_image(block))
    if parts:
        chat.append(UserMessage(role="user", content=parts))
    return chat


def _result_parts(block: ToolResultBlock) -> list[TextBlock | ImageBlock | DocumentBlock]:
    return [TextBlock(type="text", text=block.content)] if isinstance(block.content, str) else list(block.content)


def _result_text(block: ToolResultBlock) -> str:
    text = "\n".join(part.text for part in _result_parts(block) if isinstance(part, TextBlock))
    return ERROR_PREFIX + text if block.is_error else text


def _document(block: DocumentBlock) -> list[TextPart | FilePart]:
    """A document block as chat's `file` part (its `context` a text part before it)."""
    source = block.source
    name = block.title
    if isinstance(source, PdfSource):
        found = FileInput(file_data=f"data:application/pdf;base64,{source.data}", filename=name)
    elif isinstance(source, URLSource):
        found = FileInput(file_url=source.url, filename=name)
    elif isinstance(source, FileIdSource):
        found = FileInput(file_id=source.file_id, filename=name)
    else:
        text = source.data if isinstance(source, PlainTextSource) else _content_text(source)
        encoded = base64.b64encode(text.encode()).decode()
        found = FileInput(file_data=f"data:text/plain;base64,{encoded}", filename=name or "document.txt")
    parts: list[TextPart | FilePart] = []
    if block.context:
        parts.append(TextPart(type="text", text=block.context))
    return [*parts, FilePart(type="file", file=found)]


def _content_text(source: ContentSource) -> str:
    if isinstance(source.content, str):
        return source.content
    return "\n\n".join(block.text for block in source.content)


def _image(block: ImageBlock) -> ImagePart:
    return ImagePart(type="image_url", image_url=ImageURL(url=block.url))


def _assistant(message: AssistantTurn) -> list[ChatMessage]:
    if isinstance(message.content, str):
        return [AssistantMessage(role="assistant", content=message.content)]
    texts: list[str] = []
    calls: list[ToolCallParam] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            arguments = json.dumps(block.input)
            calls.append(ToolCallParam(id=block.id, function=FunctionCallParam(name=block.name, arguments=arguments)))
    return [AssistantMessage(role="assistant", content="".join(texts) or None, tool_calls=calls or None)]


def functions(body: MessagesInput) -> list[FunctionDefinition]:
    """The request's tools as function definitions."""
    return [
        FunctionDefinition(name=tool.name, description=tool.description, parameters=tool.input_schema)
        for tool in body.tools or []
    ]


def tool_choice(body: MessagesInput) -> tuple[Literal["none", "auto", "required"] | None, str | None, bool]:
    """`tool_choice` as the tool plan takes it: (choice, named function, parallel calls)."""
    choice = body.tool_choice
    if choice is None or isinstance(choice, NoneChoice):
        return (None if choice is None else "none"), None, True
    parallel = not choice.disable_parallel_tool_use
    if isinstance(choice, NamedChoice):
        return None, choice.name, parallel
    return ("required" if isinstance(choice, AnyChoice) else "auto"), None, parallel

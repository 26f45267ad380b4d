"""A chat's parts, walked in one place for the document stage and the image pipeline: the user
messages with a list of parts, the parts of one kind in conversation order, a message's text, and
the chat written as the decoder's text messages (`rewrite`).

`rewrite` is proxy vision's last step (a chat with images becomes a text-only chat: each user
message with images becomes one text message, its text parts and one ``Image N: <caption>`` line
per image at the image's place, N counted across the conversation so that earlier turns keep their
numbers) and how a chat is counted before its images are captioned (`as_text`: each image's line
without a caption). Other messages pass as text (`plain_message`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from pydantic import Field

from deployments.protocol.openai.chat import AssistantMessage, ChatMessage, ToolMessage, UserMessage
from deployments.protocol.openai.common import FilePart, ImagePart, TextPart, ToolCall, ToolCallFunction
from deployments.protocol.replica import TextMessage

P = TypeVar("P", TextPart, ImagePart, FilePart)


class ImageBytesPart(ImagePart):
    """An image part whose bytes the ingress already holds (a document's page, rendered by its
    reader): the image pipeline takes `data` as it is, with the same checks and cache keys as a URL's
    bytes, and never fetches or decodes `image_url` (a name for logs).
    """

    data: bytes = Field(exclude=True, repr=False)


def user_lists(messages: list[ChatMessage]) -> Iterator[tuple[int, UserMessage]]:
    """`(message index, message)` of every user message whose content is a list of parts."""
    for i, msg in enumerate(messages):
        if isinstance(msg, UserMessage) and isinstance(msg.content, list):
            yield i, msg


def parts_of(messages: list[ChatMessage], kind: type[P]) -> Iterator[tuple[int, int, P]]:
    """`(message index, part index, part)` of every part of `kind` in user messages, in conversation order."""
    for i, msg in user_lists(messages):
        for j, part in enumerate(msg.content):
            if isinstance(part, kind):
                yield i, j, part


def count_images(messages: list[ChatMessage]) -> int:
    """The number of image parts in the messages."""
    return sum(1 for _ in parts_of(messages, ImagePart))


def text_of(content: object) -> str:
    """A message's text: its string, or its text parts joined by newlines (images and documents
    not read yet are left out).
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(p.text for p in content if isinstance(p, TextPart))  # type: ignore[attr-defined]


def rewrite(messages: list[ChatMessage], captions: list[str]) -> list[TextMessage]:
    """Text-only messages, with `captions[k]` standing for the k-th image of the conversation."""
    images = count_images(messages)
    if images != len(captions):
        raise ValueError(f"{len(captions)} captions for {images} images")
    out = []
    n = 0
    for msg in messages:
        if isinstance(msg, UserMessage) and isinstance(msg.content, list):
            lines = []
            for part in msg.content:
                if isinstance(part, ImagePart):
                    lines.append(f"Image {n + 1}: {captions[n]}")
                    n += 1
                elif isinstance(part, TextPart) and part.text:
                    lines.append(part.text)
            out.append(TextMessage(role="user", content="\n".join(lines)))
        else:
            out.append(plain_message(msg))
    return out


def as_text(messages: list[ChatMessage]) -> list[TextMessage]:
    """`messages` as the decoder's text messages before captioning (each image's line without its caption)."""
    return rewrite(messages, [""] * count_images(messages))


def plain_message(msg: ChatMessage) -> TextMessage:
    """A message as it is, in text (list content joined; an assistant's tool calls and a tool
    message's call id kept; `developer` is `system`). Its image parts, if any, are dropped.
    """
    if isinstance(msg, AssistantMessage) and msg.tool_calls:
        calls = [
            ToolCall(id=c.id, function=ToolCallFunction(name=c.function.name, arguments=c.function.arguments))
            for c in msg.tool_calls
        ]
        return TextMessage(role="assistant", content=text_of(msg.content), tool_calls=calls)
    if isinstance(msg, ToolMessage):
        return TextMessage(role="tool", content=text_of(msg.content), tool_call_id=msg.tool_call_id)
    return TextMessage(role="system" if msg.role == "developer" else msg.role, content=text_of(msg.content))

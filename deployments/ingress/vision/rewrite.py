"""Proxy vision's last step: a chat with images becomes a text-only chat for a text-only decoder.

Each user message with `image_url` parts becomes one text message: its text parts and one
``Image N: <caption>`` line per image, each at the image's position. N counts images across the
whole conversation, so earlier turns keep their numbers. Other messages pass unchanged (list
content is joined to text; an assistant's tool calls and a tool message's call id are kept). An
image that could not be captioned gets `unseen_marker` in place of its caption: an instruction (do
not describe it; say it was not seen), not a bare fact the model may talk around.
"""

from __future__ import annotations

from deployments.ingress.vision.collect import count_images, text_of
from deployments.protocol.openai.chat import AssistantMessage, ChatMessage, ToolMessage, UserMessage
from deployments.protocol.openai.common import ImagePart, TextPart, ToolCall, ToolCallFunction, UnseenReason
from deployments.protocol.replica import TextMessage

_WHY: dict[UnseenReason, str] = {
    "captioner_unavailable": "the vision model is unavailable",
    "captioner_timeout": "the vision model did not answer in time",
}


def unseen_marker(reason: UnseenReason) -> str:
    """What the decoder reads in place of an image nobody described: that there was an image, that
    it was not seen and why, and what to do about it (not describe it; say so)."""
    return (
        f"[The user attached an image here, but it could not be seen ({_WHY[reason]}). "
        "Do not describe it or guess what it shows; tell the user you cannot see it.]"
    )


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


def plain_message(msg: ChatMessage) -> TextMessage:
    """A message as it is, in text (list content joined; an assistant's tool calls and a tool
    message's call id kept; `developer` is `system`). Its image parts, if any, are dropped."""
    if isinstance(msg, AssistantMessage) and msg.tool_calls:
        calls = [
            ToolCall(id=c.id, function=ToolCallFunction(name=c.function.name, arguments=c.function.arguments))
            for c in msg.tool_calls
        ]
        return TextMessage(role="assistant", content=text_of(msg.content), tool_calls=calls)
    if isinstance(msg, ToolMessage):
        return TextMessage(role="tool", content=text_of(msg.content), tool_call_id=msg.tool_call_id)
    return TextMessage(role="system" if msg.role == "developer" else msg.role, content=text_of(msg.content))

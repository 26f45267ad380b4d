"""Native vision's last step in the ingress: a chat with images becomes messages whose image parts
keep their place as slots (`MessageImage`, numbered across the conversation in order) for a VLM's
chat template; the checked image bytes travel beside them, once, in `GenerateRequest.images`.
Messages without images pass as text, as in proxy vision.
"""

from __future__ import annotations

from deployments.ingress.media.chat import plain_message, text_of
from deployments.protocol.openai.chat import ChatMessage, UserMessage
from deployments.protocol.openai.common import ImagePart, TextPart
from deployments.protocol.replica import MessageImage, MessagePart, MessageText, TextMessage


def native_messages(messages: list[ChatMessage]) -> list[TextMessage]:
    """The chat for a native VLM: a user message with images keeps its parts in order, the k-th image
    of the conversation as the slot `index=k`; `content` holds its text alone.
    """
    out = []
    n = 0
    for msg in messages:
        if (
            isinstance(msg, UserMessage)
            and isinstance(msg.content, list)
            and any(isinstance(part, ImagePart) for part in msg.content)
        ):
            parts: list[MessagePart] = []
            for part in msg.content:
                if isinstance(part, ImagePart):
                    parts.append(MessageImage(index=n))
                    n += 1
                elif isinstance(part, TextPart) and part.text:
                    parts.append(MessageText(text=part.text))
            out.append(TextMessage(role="user", content=text_of(msg.content), parts=parts))
        else:
            out.append(plain_message(msg))
    return out

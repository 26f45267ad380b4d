"""The images of a chat, in conversation order: counted against the limits, then loaded (fetched
concurrently), checked and hashed, each with the text of its message (for the caption prompt)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from deployments.config import ImageInputConfig
from deployments.errors import InvalidRequestError
from deployments.ingress.vision.cache import image_digest
from deployments.ingress.vision.check import load_image
from deployments.monitoring.access_log import ImageStats
from deployments.protocol.openai.chat import ChatMessage, UserMessage
from deployments.protocol.openai.common import ImagePart, TextPart


@dataclass(frozen=True)
class ImageInput:
    """One image of the conversation, in order: its bytes, their SHA-256 and the text of its message."""

    data: bytes
    user_text: str
    digest: str


def text_of(content: object) -> str:
    """A message's text: its string, or its text parts joined by newlines (images and documents
    not read yet are left out)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(p.text for p in content if isinstance(p, TextPart))  # type: ignore[attr-defined]


def _image_parts(messages: list[ChatMessage]) -> Iterator[tuple[int, int, UserMessage, ImagePart]]:
    """`(message index, part index, message, part)` for every image, in conversation order."""
    for i, msg in enumerate(messages):
        if isinstance(msg, UserMessage) and isinstance(msg.content, list):
            for j, part in enumerate(msg.content):
                if isinstance(part, ImagePart):
                    yield i, j, msg, part


def count_images(messages: list[ChatMessage]) -> int:
    return sum(1 for _ in _image_parts(messages))


def check_image_counts(messages: list[ChatMessage], config: ImageInputConfig) -> None:
    """`InvalidRequestError` when a message or the request carries more images than allowed."""
    per_message = Counter(i for i, *_ in _image_parts(messages))
    total = sum(per_message.values())
    if total > config.max_images_per_request:
        raise InvalidRequestError(
            f"The request has {total} images; the limit is {config.max_images_per_request}.", param="messages"
        )
    for i, count in per_message.items():
        if count > config.max_images_per_message:
            raise InvalidRequestError(
                f"Message {i} has {count} images; the limit is {config.max_images_per_message} per message.",
                param=f"messages[{i}].content",
            )


async def collect_images(
    messages: list[ChatMessage], config: ImageInputConfig, stats: ImageStats | None = None
) -> list[ImageInput]:
    """All images of the conversation, counted against the limits, then loaded (fetched concurrently),
    validated and hashed, in order. `stats` gets their sizes and fetch times."""
    check_image_counts(messages, config)

    async def one(i: int, j: int, msg: UserMessage, part: ImagePart) -> ImageInput:
        param = f"messages[{i}].content[{j}].image_url"
        data = await load_image(part.image_url.url, config, param=param, stats=stats)
        return ImageInput(data, text_of(msg.content), await asyncio.to_thread(image_digest, data))

    return list(await asyncio.gather(*(one(*found) for found in _image_parts(messages))))

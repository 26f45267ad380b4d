"""The images of a chat, in conversation order: counted against the limits, then loaded (fetched
concurrently), checked and hashed, each with the text of its message (for the caption prompt).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

from deployments.config import ImageInputConfig
from deployments.errors import InvalidRequestError
from deployments.ingress.media.chat import parts_of, text_of
from deployments.ingress.vision.cache import image_digest
from deployments.ingress.vision.check import load_part
from deployments.monitoring.access_log import ImageStats
from deployments.protocol.openai.chat import ChatMessage
from deployments.protocol.openai.common import ImagePart


@dataclass(frozen=True)
class ImageInput:
    """One image of the conversation, in order: its bytes, their SHA-256 and the text of its message."""

    data: bytes
    user_text: str
    digest: str


def check_image_counts(messages: list[ChatMessage], config: ImageInputConfig) -> None:
    """`InvalidRequestError` when a message or the request carries more images than allowed."""
    per_message = Counter(i for i, _, _ in parts_of(messages, ImagePart))
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
    validated and hashed, in order. `stats` gets their sizes and fetch times.
    """
    check_image_counts(messages, config)

    async def one(i: int, j: int, part: ImagePart) -> ImageInput:
        data = await load_part(part, config, param=f"messages[{i}].content[{j}].image_url", stats=stats)
        return ImageInput(data, text_of(messages[i].content), await asyncio.to_thread(image_digest, data))

    return list(await asyncio.gather(*(one(*found) for found in parts_of(messages, ImagePart))))

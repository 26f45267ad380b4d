"""Image bytes the ingress checked, decoded where a model needs pixels (captioner and native VLM),
and a native VLM's chat read for its template (`image_slots`: each engine library renders it).
"""

from __future__ import annotations

import io
from typing import Any

from PIL import Image

from deployments.errors import InvalidRequestError
from deployments.protocol.replica import ImageBytes, MessageImage, TextMessage


def decode_rgb(data: bytes) -> Image.Image:
    """Full decode of image bytes the ingress checked: first frame, RGB."""
    with Image.open(io.BytesIO(data)) as img:
        img.seek(0)
        if img.mode == "P" and "transparency" in img.info:  # PIL wants palette transparency via RGBA
            return img.convert("RGBA").convert("RGB")
        return img.convert("RGB")


def image_slots(
    messages: list[TextMessage], images: list[ImageBytes], image_part: dict[str, Any]
) -> tuple[list[list[dict[str, Any]] | None], list[tuple[int, int]]]:
    """A chat whose image slots index `images`, as a chat template takes its parts: each message's
    parts (None for a message of text alone), an image slot as `image_part`, and the slots in prompt
    order as ``(message index, image index)``. A slot with no image is a 400.
    """
    contents: list[list[dict[str, Any]] | None] = []
    slots: list[tuple[int, int]] = []
    for i, message in enumerate(messages):
        if message.parts is None:
            contents.append(None)
            continue
        parts: list[dict[str, Any]] = []
        for part in message.parts:
            if isinstance(part, MessageImage):
                if part.index >= len(images):
                    raise InvalidRequestError(f"Image slot {part.index} has no image.", param=f"messages[{i}]")
                slots.append((i, part.index))
                parts.append(image_part)
            else:
                parts.append({"type": "text", "text": part.text})
        contents.append(parts)
    return contents, slots

"""Image bytes the ingress checked, decoded where a model needs pixels (captioner and native VLM)."""

from __future__ import annotations

import io

from PIL import Image


def decode_rgb(data: bytes) -> Image.Image:
    """Full decode of image bytes the ingress checked: first frame, RGB."""
    with Image.open(io.BytesIO(data)) as img:
        img.seek(0)
        if img.mode == "P" and "transparency" in img.info:  # PIL wants palette transparency via RGBA
            return img.convert("RGBA").convert("RGB")
        return img.convert("RGB")

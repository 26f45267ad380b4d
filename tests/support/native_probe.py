"""A native VLM engine for tests (``engine: tests.support.native_probe:ProbedNativeEngine``):
the real `NativeVisionEngine`, plus what a test needs to see from outside the replica.

- `pixel_hashes` (on /health, the decoder's details): a SHA-256 of each image's `pixel_values` as
  the vision tower received them (`pixel_sha256`), so a test proves that the image it sent, and not
  a caption, reached the model.
- An image whose top-left pixel is `REFUSED_COLOUR` makes the processor raise, as a processor that
  cannot take an image would: that request fails, the others go on.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from PIL import Image

from deployments.config import ModelConfig
from deployments.engines.transformers.native import NativeVisionEngine
from deployments.engines.transformers.processor_cache import ProcessedImage

REFUSED_COLOUR = (255, 0, 255)


def pixel_sha256(pixel_values: torch.Tensor) -> str:
    """The hash of one image's pixel values (float32, contiguous)."""
    return hashlib.sha256(pixel_values.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()


class ProbedNativeEngine(NativeVisionEngine):
    def __init__(self, model: ModelConfig) -> None:
        super().__init__(model)  # the load-time profile runs before the probe is attached
        self.pixel_hashes: list[str] = []
        tower: Any = self.model.model.vision_tower
        tower.register_forward_pre_hook(self._record, with_kwargs=True)
        process = self.prompts.process

        def refusing(image: Image.Image) -> ProcessedImage:
            if image.getpixel((0, 0)) == REFUSED_COLOUR:
                raise ValueError("this processor refuses the probe's colour")
            return process(image)

        self.prompts.process = refusing  # type: ignore[method-assign]

    def _record(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        pixels = args[0] if args else kwargs["pixel_values"]
        self.pixel_hashes = [*self.pixel_hashes, *(pixel_sha256(p) for p in pixels)][-64:]

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "pixel_hashes": self.pixel_hashes}

"""`LlamaCppCaptionEngine`: a GGUF vision-language model on llama.cpp as the captioner of proxy vision.

A batch of (image, prompt) pairs from the replica's `Batcher` runs as that many concurrent requests
in one `LlamaCppVisionEngine`, one per slot (`captioning.max_batch_size` slots), so llama.cpp decodes
their captions together at every step. Each is the chat the transformers captioner prompts with (a
user message: the image, then the captioning prompt), greedy, at most `captioning.max_new_tokens`.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from PIL import Image

from deployments.config import ModelConfig
from deployments.engines.base import CaptionEngine
from deployments.engines.llamacpp.media import png
from deployments.engines.llamacpp.vision import LlamaCppVisionEngine
from deployments.protocol.replica import GenerateRequest, ImageBytes, MessageImage, MessageText, TextMessage
from deployments.roles import Role


class LlamaCppCaptionEngine(CaptionEngine):
    """The captioner of proxy vision on llama.cpp: a batch's captions decoded together, one per slot."""

    device = "cpu"

    def __init__(self, model: ModelConfig) -> None:
        captioning = model.captioning
        self.max_new_tokens = captioning.max_new_tokens
        self.slots = captioning.max_batch_size
        params = model.params.model_copy(update={"max_num_seqs": self.slots, "max_tokens": self.max_new_tokens})
        self.vlm = LlamaCppVisionEngine(model.model_copy(update={"params": params}), Role.CAPTIONER)
        self._pool = ThreadPoolExecutor(self.slots, thread_name_prefix="llamacpp-caption")

    def describe(self) -> dict[str, Any]:
        return {**self.vlm.describe(), "max_new_tokens": self.max_new_tokens, "max_batch_size": self.slots}

    def stats(self) -> dict[str, Any]:
        return self.vlm.stats()

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self.vlm.close()

    def caption(self, images: list[Image.Image], prompts: list[str]) -> list[str]:
        return list(self._pool.map(self._caption, images, prompts))

    def _caption(self, image: Image.Image, prompt: str) -> str:
        data = png(image)
        request = GenerateRequest(
            messages=[
                TextMessage(role="user", content=prompt, parts=[MessageImage(index=0), MessageText(text=prompt)])
            ],
            images=[ImageBytes(data=data, sha256=hashlib.sha256(data).hexdigest())],
            max_tokens=self.max_new_tokens,
            temperature=0.0,
        )
        return self.vlm.complete(request).strip()

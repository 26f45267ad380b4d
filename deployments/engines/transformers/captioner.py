"""A transformers vision-language model (`AutoProcessor` + `AutoModelForImageTextToText`) as a
batched `CaptionEngine`: all images of a call are captioned in one `generate`.
"""

from __future__ import annotations

from typing import Any

import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from deployments.config import ModelConfig
from deployments.engines.base import CaptionEngine
from deployments.engines.transformers.base import TransformersEngine
from deployments.roles import Role


class TransformersCaptionEngine(TransformersEngine, CaptionEngine):
    """The captioner on transformers: a VLM that captions a call's images in one `generate`."""

    FRONT = ("processor", AutoProcessor)
    MODEL = AutoModelForImageTextToText

    def __init__(self, model: ModelConfig) -> None:
        super().__init__(Role.CAPTIONER, model)
        self.processor = self.front
        self.max_new_tokens = model.captioning.max_new_tokens
        self.progress.done(self.model)

    def check_front(self, model: ModelConfig) -> None:
        tokenizer = getattr(self.front, "tokenizer", None)
        if tokenizer is not None:
            tokenizer.padding_side = "left"  # batched generation appends after the prompt

    def describe(self) -> dict[str, Any]:
        return {
            **self.params.model_dump(include={"quantization", "device_ids", "max_num_seqs"}),
            **super().describe(),
            "max_new_tokens": self.max_new_tokens,
        }

    def _prompt(self, text: str) -> str:
        if getattr(self.processor, "chat_template", None):
            chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
            return self.processor.apply_chat_template(chat, add_generation_prompt=True)
        return text

    def caption(self, images: list[Image.Image], prompts: list[str]) -> list[str]:
        if not images:
            return []
        inputs = self.processor(
            text=[self._prompt(p) for p in prompts],
            images=[[img] for img in images],
            return_tensors="pt",
            padding=True,
        )
        inputs = inputs.to(self.model.device)
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(self.model.dtype)
        with torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=self.max_new_tokens, do_sample=False)
        new_tokens = out[:, inputs["input_ids"].shape[1] :]
        return [c.strip() for c in self.processor.batch_decode(new_tokens, skip_special_tokens=True)]

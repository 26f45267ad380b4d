"""A native VLM's prompt: the chat rendered by the processor's chat template (an image slot becomes
the model's placeholder), tokenized, and each placeholder replaced by its image's expansion (the
image's feature tokens, as the processor expands them), next to the image tensors the model takes.

Images go through the processor one at a time, through the replica's `ProcessorCache` (a repeated
image is processed once), so that a prompt can be assembled from cached images: the placeholder's
expansion of a lone image is the same ids it has inside a whole prompt (LLaVA repeats `<image>`,
Qwen2-VL `<|image_pad|>`, Idefics3 writes its rows and columns). The count of the prompt's ids is
therefore the context the request takes, image tokens included.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from PIL import Image

from deployments.engines.images import decode_rgb, image_slots
from deployments.engines.transformers.chat_template import ToolRendering
from deployments.engines.transformers.processor_cache import ProcessedImage, ProcessorCache
from deployments.errors import ConfigError, InvalidImageError, InvalidRequestError
from deployments.protocol.replica import ImageBytes, TextMessage
from deployments.tools.prompt import template_message

_TEXT_INPUTS = ("input_ids", "attention_mask")


@dataclass(frozen=True)
class NativePrompt:
    """Token ids with the images' expansions in place; `aligned`: the processor's other per-token
    outputs (0 on text tokens); `images`: the images in prompt order.
    """

    ids: list[int]
    aligned: dict[str, list[int]] = field(default_factory=dict)
    images: list[ProcessedImage] = field(default_factory=list)

    @property
    def image_tokens(self) -> int:
        return sum(len(image.tokens) for image in self.images)


def _aligned(key: str) -> bool:
    """Per-token outputs of a processor beside `input_ids` (e.g. Qwen2-VL's `mm_token_type_ids`)."""
    return key.endswith("token_type_ids")


class NativePromptBuilder:
    """Builds a native VLM's prompt ids and image tensors from a chat (see the module docstring)."""

    def __init__(self, processor: Any, image_token: str | None, cache: ProcessorCache, tools: ToolRendering) -> None:
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.cache = cache
        token = image_token or getattr(processor, "image_token", None)
        if not token:
            raise ConfigError("the processor names no image token: set capabilities.image_token")
        self.image_token: str = token
        self.image_token_id = int(self.tokenizer.convert_tokens_to_ids(token))
        if not getattr(processor, "chat_template", None):
            raise ConfigError("the processor has no chat template; use an instruct VLM")
        self.tools = tools

    def chat(
        self,
        messages: list[TextMessage],
        images: list[ImageBytes],
        tools: list[dict[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        add_special_tokens: bool = False,
    ) -> NativePrompt:
        """The prompt of a chat whose image slots index `images` (by default with the generation
        prompt, as a request is prompted; the other arguments are /tokenize's).
        """
        parts, slots = image_slots(messages, images, {"type": "image"})
        rendered = [
            template_message(message) if content is None else {"role": message.role, "content": content}
            for message, content in zip(messages, parts, strict=True)
        ]
        rendered, extra = self.tools.chat(rendered, tools)
        text = self.processor.apply_chat_template(
            rendered,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tokenize=False,
            **extra,
        )
        ids = list(self.tokenizer(text, add_special_tokens=add_special_tokens).input_ids)
        processed = [self.image(images[k], param=f"messages[{i}].content") for i, k in slots]
        return self.assemble(ids, processed)

    def text(self, ids: list[int]) -> NativePrompt:
        """A legacy completion's prompt: text only (an image placeholder in it is a 400)."""
        return self.assemble(ids, [])

    def assemble(self, ids: list[int], images: list[ProcessedImage]) -> NativePrompt:
        """`ids` with its k-th image placeholder replaced by `images[k]`'s expansion."""
        places = [p for p, token in enumerate(ids) if token == self.image_token_id]
        if len(places) != len(images):
            raise InvalidRequestError(
                f"The prompt has {len(places)} image placeholders ({self.image_token}) for {len(images)} images: "
                f"remove {self.image_token} from the text.",
                param="messages" if images else None,
            )
        out: list[int] = []
        keys = {key for image in images for key in image.aligned}
        aligned: dict[str, list[int]] = {key: [] for key in keys}
        start = 0
        for place, image in zip(places, images, strict=True):
            text = ids[start:place]
            out += text
            out += image.tokens
            for key in keys:
                aligned[key] += [0] * len(text) + list(image.aligned.get(key, (0,) * len(image.tokens)))
            start = place + 1
        out += ids[start:]
        for key in keys:
            aligned[key] += [0] * (len(ids) - start)
        return NativePrompt(out, aligned, images)

    def image(self, image: ImageBytes, *, param: str) -> ProcessedImage:
        """What the processor makes of one image, from the cache when it was seen before (by the hash
        the ingress sent with it). A processor that fails on it is this request's 400.
        """
        if (cached := self.cache.get(image.sha256)) is not None:
            return cached
        try:
            entry = self.process(decode_rgb(image.data))
        except Exception as exc:  # the image is what this processor cannot take; the others go on
            raise InvalidImageError(
                f"The model's image processor could not process an image: {type(exc).__name__}: {exc}"[:500],
                param=param,
            ) from None
        self.cache.put(image.sha256, entry)
        return entry

    def process(self, image: Image.Image) -> ProcessedImage:
        """The processor's output for one image: its placeholder's expansion and its tensors."""
        out = self.processor(text=self.image_token, images=[image], add_special_tokens=False, return_tensors="pt")
        tensors = {k: v for k, v in out.items() if isinstance(v, torch.Tensor)}
        return ProcessedImage(
            tokens=tuple(tensors["input_ids"][0].tolist()),
            aligned={k: tuple(v[0].tolist()) for k, v in tensors.items() if _aligned(k)},
            tensors={k: v for k, v in tensors.items() if k not in _TEXT_INPUTS and not _aligned(k)},
        )

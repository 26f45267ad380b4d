"""`LlamaCppVisionEngine`: a GGUF vision-language model on llama.cpp (`vision_mode: native`): the
language model (`weight_file`) and its multimodal projector (`mmproj_file`, llama.cpp's mtmd), in
the replica's process, its slots batched at every step as for text.

A chat with images is rendered by the GGUF's own template with each image as llama.cpp's media
marker (``/apply-template``, which renders an OpenAI image part as the marker, as a chat request
would, joining a message's parts without a newline around an image; the part it is given is a
placeholder of no bytes: the route only replaces it), and sent to llama.cpp's
``/completion`` route as ``{"prompt_string": text, "multimodal_data": [base64, ...]}``, the k-th
image at the k-th marker. The marker is the random one this server drew (its ``/props``), so no
text a client sends can stand for an image. Chats without images and legacy completions are token
ids, as in `LlamaCppTextEngine`, on the same route.

Counting, before the request starts: mtmd tokenizes the text between the markers piece by piece
(the BOS and EOS the model adds around the whole), and puts each image's tokens at its marker, so
a prompt's tokens are the pieces' (one ``/tokenize`` call with the pieces as a list) plus each
image's (`media.ImageTokens`). That count is checked against the context by `context.fit_context`
(a 400 with the numbers, how many of them image tokens; or `context_overflow: truncate`, which
drops whole turns, an image with its message, never part of one); the usage reports llama.cpp's
own count (``tokens_evaluated``), which is the same.

Images from concurrent requests are encoded by mtmd in llama.cpp's loop when their slot's prompt
reaches them, and their sequences then decode together with the others in every step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from deployments.config import ImageInputConfig, ModelConfig
from deployments.engines.context import fit_rendered
from deployments.engines.defaults import limits as request_limits
from deployments.engines.extensions import refuse_unsupported
from deployments.engines.images import image_slots
from deployments.engines.llamacpp.engine import LlamaCppTextEngine, Prepared
from deployments.engines.llamacpp.files import mmproj_path
from deployments.engines.llamacpp.gguf_meta import read_metadata
from deployments.engines.llamacpp.media import (
    FIXED_SIZE_PROJECTORS,
    PROBE_SIZE,
    ImageTokens,
    PromptCount,
    base64_text,
    data_url,
    llama_image,
    probe_image,
)
from deployments.engines.llamacpp.params import LlamaCppError, completion_body, read_native_chunk
from deployments.engines.llamacpp.prompts import piece_text
from deployments.engines.load_log import LoadLog
from deployments.errors import ConfigError, InvalidImageError, InvalidRequestError
from deployments.protocol.replica import (
    GenerateRequest,
    ImageBytes,
    TextMessage,
    TokenizedPrompt,
    TokenizeInput,
)
from deployments.roles import Role

logger = logging.getLogger("ray.serve")
# An image's place for /apply-template, which turns it into the marker without reading it.
IMAGE_PART: dict[str, Any] = {"type": "image_url", "image_url": {"url": "data:image/png;base64,"}}


@dataclass(frozen=True)
class MediaPrompt:
    """A chat with images as llama.cpp takes it: the rendered text with a marker per image, the
    images in marker order (indices into the request's `images`), and its count.
    """

    text: str
    images: list[int]
    count: PromptCount


class LlamaCppVisionEngine(LlamaCppTextEngine):
    """A GGUF vision-language model on llama.cpp: the text engine with a projector that takes images."""

    takes_images = True

    def __init__(self, model: ModelConfig, role: Role = Role.DECODER) -> None:
        super().__init__(model, role)
        try:
            self._start_vision(model)
        except BaseException:
            self.close()  # the server started: free it
            raise

    def _start_vision(self, model: ModelConfig) -> None:
        """The media marker, the projector's type and the tokens of an image (the load-time probe)."""
        props = self._server.call("/props")
        if not (props.get("modalities") or {}).get("vision"):
            raise ConfigError(f"model {model.name!r}: llama.cpp loaded {self.projector} without a vision encoder")
        self.marker = str(props["media_marker"])
        self.specials = len(self._call("/tokenize", {"content": "", "add_special": True}, "messages")["tokens"])
        meta = read_metadata(self.projector) if self.projector else {}
        self.projector_type = str(meta.get("clip.projector_type") or meta.get("clip.vision.projector_type") or "")
        fixed = self.projector_type in FIXED_SIZE_PROJECTORS and not meta.get("clip.vision.image_grid_pinpoints")
        alone = self.render_chat([TextMessage(role="user", content="")], None, [[IMAGE_PART]])
        self._image_alone = self.count(alone, 1)  # a chat holding one image: its text's tokens
        self.image_tokens = ImageTokens(self._measure, fixed, probe_image())
        limit = model.capabilities.max_images_per_request
        self.max_images = ImageInputConfig().max_images_per_request if limit is None else limit
        logger.info(
            "model %s: projector %s (%s), %s image tokens per image",
            self.name,
            self.projector,
            self.projector_type or "unknown type",
            self.image_tokens.probe
            if fixed
            else f"by size ({self.image_tokens.probe} for {PROBE_SIZE[0]}x{PROBE_SIZE[1]} px)",
        )

    def projector_file(self, model: ModelConfig, progress: LoadLog) -> Path | None:
        return mmproj_path(model, progress)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "mmproj": str(self.projector),
            "projector_type": self.projector_type,
            "image_tokens": self.image_tokens.describe(),
            "max_images_per_request": self.max_images,
        }

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "image_tokens": self.image_tokens.describe()}

    def complete(self, request: GenerateRequest) -> str:
        """A request run to its end on the calling thread (blocking), its text: the captioner's call."""
        prepared = self._prepare(request)
        pieces: list[str] = []

        def on_chunk(chunk: dict[str, Any]) -> bool:
            pieces.append(self._read(chunk).text)
            return False

        self._stream(prepared.body, on_chunk)
        return "".join(pieces)

    # ------------------------------------------------------------------ transport

    def _stream(self, body: dict[str, Any], on_chunk: Callable[[dict[str, Any]], bool]) -> None:
        self._server.stream_native(body, on_chunk)  # the one route that takes images

    _read = staticmethod(read_native_chunk)

    # ------------------------------------------------------------------ the prompt

    def _prepare(self, request: GenerateRequest) -> Prepared:
        if not request.images:
            return super()._prepare(request)
        refuse_unsupported(request, ("chat_template_kwargs", "add_generation_prompt"), "llama.cpp, with images")
        if request.prompt is not None:
            raise InvalidRequestError("A legacy completion takes no images.", param="prompt")
        converted: dict[int, bytes] = {}  # this request's images as llama.cpp takes them

        def image(k: int) -> bytes:
            if k not in converted:
                converted[k] = llama_image(request.images[k].data)
            return converted[k]

        limits = request_limits(self.max_model_len, request, self.params)
        prompt, fitted = fit_rendered(
            request.messages,
            lambda chat: self.media_prompt(chat, request.images, request.tools, image),
            lambda built: built.count.total,
            limits,
            self.params.context_overflow,
            lambda built: f" ({built.count.images} of them image tokens)" if built.count.images else "",
        )
        body = completion_body(request, self.params, self.vocab_size, self.max_model_len)
        multimodal = [base64_text(image(k)) for k in prompt.images]
        body = {
            **body,
            "prompt": {"prompt_string": prompt.text, **({"multimodal_data": multimodal} if multimodal else {})},
            "n_predict": fitted.max_tokens,
        }
        return Prepared(prompt.count.total, body, fitted.dropped_prompt_tokens)

    def media_prompt(
        self,
        messages: list[TextMessage],
        images: list[ImageBytes],
        tools: list[dict[str, Any]] | None = None,
        image: Callable[[int], bytes] | None = None,
        add_generation_prompt: bool = True,
    ) -> MediaPrompt:
        """The prompt of a chat whose image slots index `images` (see the module's docstring);
        `image(k)`: the k-th image's bytes as llama.cpp takes them (default: converted here).
        """
        read = image or (lambda k: llama_image(images[k].data))
        parts, slots = image_slots(messages, images, IMAGE_PART)
        contents: list[Any] = [message.content if p is None else p for message, p in zip(messages, parts, strict=True)]
        order = [k for _, k in slots]
        text = self.render_chat(messages, tools, contents, add_generation_prompt)
        image_tokens = sum(self.image_tokens.count(images[k].sha256, partial(read, k)) for k in order)
        return MediaPrompt(text, order, self.count(text, len(order), image_tokens))

    def media_tokens(self, request: TokenizeInput) -> TokenizedPrompt:
        """/tokenize of a chat with images: counted as a request is (`media_prompt`); `tokens` are the
        ids of the model's own tokens (a BOS) and of the text between the markers, in order; the
        images' tokens are embeddings with no ids, counted in `image_tokens` alone.
        """
        prompt = self.media_prompt(
            request.messages, request.images, request.tools, add_generation_prompt=request.add_generation_prompt
        )
        own = self._call("/tokenize", {"content": "", "add_special": True, "with_pieces": True}, "messages")["tokens"]
        body = {"content": prompt.text.split(self.marker), "add_special": False, "parse_special": True}
        text = self._call("/tokenize", {**body, "with_pieces": True}, "messages")["tokens"]
        ids = [int(t["id"]) for t in own + text]
        strs = [piece_text(t["piece"]) for t in own + text]
        return self._tokenized(ids, strs, request, image_tokens=prompt.count.images)

    def count(self, text: str, images: int, image_tokens: int = 0) -> PromptCount:
        """The count that mtmd makes of a rendered prompt with `images` markers (see the module's docstring)."""
        pieces = text.split(self.marker)
        if len(pieces) != images + 1:
            raise InvalidRequestError(
                f"The model's chat template rendered {len(pieces) - 1} of the request's {images} images.",
                param="messages",
            )
        body = {"content": pieces, "add_special": False, "parse_special": True}
        tokens = self._call("/tokenize", body, "messages")["tokens"]
        return PromptCount(self.specials, len(tokens), image_tokens)

    def _measure(self, data: bytes) -> int:
        """llama.cpp's count of one image (see `media`): a chat holding it alone, less its text."""
        part = {"type": "image_url", "image_url": {"url": data_url(data)}}
        try:
            chat = {"messages": [{"role": "user", "content": [part]}]}
            answer = self._server.call("/v1/chat/completions/input_tokens", chat)
        except LlamaCppError as exc:  # its decoder refused the bytes
            raise InvalidImageError(f"llama.cpp could not read an image: {exc}"[:500], param="messages") from None
        return int(answer["input_tokens"]) - self._image_alone.total

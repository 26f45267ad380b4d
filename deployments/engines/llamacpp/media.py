"""Images as llama.cpp's multimodal code (mtmd) takes them, and what each costs in prompt tokens.

- `llama_image`: the bytes llama.cpp decodes (stb_image: PNG and baseline or progressive JPEG as
  they are; WebP, GIF and JPEGs in other colour spaces re-encoded as PNG, decoded as the
  transformers engines decode them: first frame, RGB).
- `ImageTokens`: the prompt tokens one image takes. mtmd decides: a projector that resizes every
  image to one square size (LLaVA's ``mlp``, MobileVLM's ``ldp``/``ldpv2``, Gemma 3) gives every
  image the same count, measured once at load; the others (Qwen2-VL, Idefics3, Pixtral, LLaVA-1.6
  with its grid pinpoints, ...) count by the image's size, so each image is measured once (cached by
  its hash) by llama.cpp's own counter.
- A measurement is llama.cpp's count of a chat holding the image alone (its
  ``/v1/chat/completions/input_tokens`` route, which tokenizes it as a request would) less the
  count of that chat's text (`PromptCount`): what is left is the image's tokens, with the
  begin/end-of-image text some projectors put around them.
"""

from __future__ import annotations

import base64
import io
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from PIL import Image

from deployments.engines.images import decode_rgb
from deployments.errors import InvalidImageError

# Projector types whose images are all resized to one square size (mtmd's fixed-size preprocessor),
# unless the file has grid pinpoints (LLaVA-1.6's tiles).
FIXED_SIZE_PROJECTORS = frozenset({"mlp", "ldp", "ldpv2", "gemma3"})
PROBE_SIZE = (64, 48)  # the load-time probe image


def llama_image(data: bytes) -> bytes:
    """Image bytes (checked by the ingress) as llama.cpp decodes them: PNG and RGB or grey JPEG as
    they are, anything else re-encoded as PNG.
    """
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format == "PNG" or (img.format == "JPEG" and img.mode in ("RGB", "L")):
                return data
        return png(decode_rgb(data))
    except Exception as exc:  # the ingress checked it, so this is rare: the request's 400 all the same
        raise InvalidImageError(f"An image could not be read: {type(exc).__name__}") from None


def png(image: Image.Image) -> bytes:
    """A decoded image as PNG, lightly compressed (it only crosses this process's loopback)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def probe_image() -> bytes:
    """The load-time probe image (`PROBE_SIZE`, plain grey) as PNG bytes."""
    return png(Image.new("RGB", PROBE_SIZE, (128, 128, 128)))


def base64_text(data: bytes) -> str:
    """Bytes as llama.cpp's ``multimodal_data`` takes them."""
    return base64.b64encode(data).decode()


def data_url(data: bytes) -> str:
    """A data URL llama.cpp's OpenAI routes take (it sniffs the format from the bytes)."""
    return "data:image/png;base64," + base64_text(data)


@dataclass(frozen=True)
class PromptCount:
    """How mtmd counts a prompt with images: the tokens the model adds around every prompt
    (`specials`: a BOS, an EOS where it adds them), each text piece between the markers tokenized on
    its own (`pieces`), and each image's tokens (`images`).
    """

    specials: int
    pieces: int
    images: int = 0

    @property
    def total(self) -> int:
        return self.specials + self.pieces + self.images


class ImageTokens:
    """The prompt tokens of one image. `measure(data)`: llama.cpp's count for these bytes (a call to
    the server); `fixed`: the projector gives every image the same count (`probe` is then measured
    once, at construction, and used for all); `entries`: images remembered (by hash) otherwise.
    """

    def __init__(self, measure: Callable[[bytes], int], fixed: bool, probe: bytes, entries: int = 4096) -> None:
        self._measure = measure
        self.fixed = fixed
        self.probe = measure(probe)  # also checks, at load, that the server counts images
        self._entries = entries
        self._cache: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()  # counts are taken on worker threads
        self.measured = 0  # images measured after the probe, for /health

    def count(self, sha256: str, data: Callable[[], bytes]) -> int:
        """The tokens of the image with this hash; `data()`: its bytes as llama.cpp takes them (only
        read when it must be measured).
        """
        if self.fixed:
            return self.probe
        with self._lock:
            if (known := self._cache.get(sha256)) is not None:
                self._cache.move_to_end(sha256)
                return known
        tokens = self._measure(data())
        with self._lock:
            self.measured += 1
            self._cache[sha256] = tokens
            while len(self._cache) > self._entries:
                self._cache.popitem(last=False)
        return tokens

    def describe(self) -> dict[str, object]:
        if self.fixed:
            return {"per_image": self.probe}
        return {"per_image": "by size", "probe": self.probe, "measured": self.measured, "cached": len(self._cache)}

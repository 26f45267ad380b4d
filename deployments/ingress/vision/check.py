"""Image input: turn an image part into validated image bytes.

`load_image` takes ``data:image/...;base64,`` URLs (`media.data_url`) and, through
`media.fetch.fetch_image` (SSRF guard, timeouts, byte cap), ``http(s)://`` and ``file://`` URLs;
`load_part` takes a part as the chat has it, a document's page as its bytes (`ImageBytesPart`: no
base64 on the way); the sync `load_image_url` takes data URLs only. Limits come from
`ImageInputConfig`, the same for every way in. Bytes are checked here, in the CPU ingress, so that a
bad image is a 400 before it costs a GPU replica anything, and travel to the captioner once, encoded.
"""

from __future__ import annotations

import asyncio
import io
import re
import time
import warnings

from PIL import Image

from deployments.config import ImageInputConfig
from deployments.errors import InvalidImageError
from deployments.ingress.media.chat import ImageBytesPart
from deployments.ingress.media.data_url import DataURLError, decode_data_url
from deployments.ingress.media.fetch import fetch_image
from deployments.monitoring.access_log import ImageStats
from deployments.protocol.openai.common import ImagePart

ALLOWED_FORMATS = {"PNG", "JPEG", "WEBP", "GIF"}
DEFAULT_IMAGE_INPUT = ImageInputConfig()

_IMAGE_MEDIA = re.compile(r"image/[a-zA-Z0-9.+-]+")


async def load_part(part: ImagePart, config: ImageInputConfig, *, param: str, stats: ImageStats | None = None) -> bytes:
    """`load_image` of the part's URL; a page's bytes (`ImageBytesPart`) checked as a data URL's are."""
    if not isinstance(part, ImageBytesPart):
        return await load_image(part.image_url.url, config, param=param, stats=stats)
    data = part.data
    if len(data) > config.max_image_bytes:
        raise InvalidImageError(f"Image is larger than {config.max_image_bytes} bytes.", param=param)
    pixels = await asyncio.to_thread(check_image, data, param=param, config=config)
    (stats or ImageStats()).accepted(data, pixels)
    return data


async def load_image(url: str, config: ImageInputConfig, *, param: str, stats: ImageStats | None = None) -> bytes:
    """Validated image bytes from a ``data:``, ``http(s)://`` or ``file://`` URL.

    Raises `InvalidImageError` (400) naming `param` for anything wrong: scheme, a refused host or
    path, a failed or oversized download, bytes that are not a supported image. CPU work (base64,
    header parsing) runs off the event loop. `stats` gets the image's size and each fetch's time.
    """
    stats = stats or ImageStats()
    if url.startswith("data:"):
        data, pixels = await asyncio.to_thread(_load_data_url, url, param, config)
    else:
        started = time.monotonic()
        try:
            data = await fetch_image(url, config, param=param)
        except InvalidImageError:
            stats.fetched(url.split(":", 1)[0].lower() if ":" in url else "none", time.monotonic() - started, ok=False)
            raise
        stats.fetched(url.split(":", 1)[0].lower(), time.monotonic() - started, ok=True)
        pixels = await asyncio.to_thread(check_image, data, param=param, config=config)
    stats.accepted(data, pixels)
    return data


def load_image_url(url: str, *, param: str, config: ImageInputConfig = DEFAULT_IMAGE_INPUT) -> bytes:
    """Validated image bytes from a data URL, within `config`'s limits; `InvalidImageError` (400)
    naming `param` otherwise. Sync, data URLs only: remote and file URLs need `load_image`.
    """
    return _load_data_url(url, param, config)[0]


def _load_data_url(url: str, param: str, config: ImageInputConfig) -> tuple[bytes, int]:
    """`(bytes, pixels)` of a data URL's image, as `load_image_url` checks it."""
    if not url.startswith("data:"):
        scheme = url.split(":", 1)[0] if ":" in url else "(none)"
        raise InvalidImageError(
            f"Unsupported image URL scheme {scheme!r}: send images as data:image/...;base64 URLs.",
            param=param,
        )
    cap = config.max_image_bytes
    try:
        data, _ = decode_data_url(url, cap, media=_IMAGE_MEDIA)
    except DataURLError as exc:
        if exc.why == "shape":
            message = "Image data URL must look like data:image/<type>;base64,<data>."
        elif exc.why == "size":
            message = f"Image is larger than {cap} bytes."
        else:
            message = "Image data URL is not valid base64."
        raise InvalidImageError(message, param=param) from None
    return data, check_image(data, param=param, config=config)


def check_image(data: bytes, *, param: str, config: ImageInputConfig = DEFAULT_IMAGE_INPUT) -> int:
    """A known format and a bounded pixel count, read from the header before any decoding; then a
    full decode, so that a corrupt or truncated image is this request's 400 and never fails a
    captioner batch shared with other requests. Returns the pixel count.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                fmt, (width, height) = img.format, img.size
                if fmt not in ALLOWED_FORMATS:
                    raise InvalidImageError(f"Image format {fmt} is not supported (PNG, JPEG, WEBP, GIF).", param=param)
                if width * height > config.max_image_pixels:
                    raise InvalidImageError(
                        f"Image has {width}x{height} pixels; the limit is {config.max_image_pixels}.", param=param
                    )
                img.load()  # within the limits: decode it all here, so a truncated file never reaches a batch
                return width * height
    except InvalidImageError:
        raise
    except Exception:
        raise InvalidImageError("Image bytes are not a readable image.", param=param) from None

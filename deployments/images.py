"""Image input: turn an `image_url` into validated, encoded image bytes.

Only `data:image/...;base64,` URLs are accepted for now; any other scheme is a 400 (remote fetching
arrives with its SSRF guard, not before). Bytes are checked here, in the CPU ingress, so that a bad
image is a 400 before it costs a GPU replica anything, and travel to the captioner once, encoded.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings

from PIL import Image

from deployments.errors import InvalidImageError

ALLOWED_FORMATS = {"PNG", "JPEG", "WEBP", "GIF"}
MAX_IMAGE_BYTES = 20 * 1024 * 1024
MAX_IMAGE_PIXELS = 40_000_000

_DATA_URL = re.compile(r"^data:image/(?P<subtype>[a-zA-Z0-9.+-]+);base64,(?P<payload>.*)$", re.DOTALL)


def load_image_url(url: str, *, param: str) -> bytes:
    """Validated image bytes from a data URL; `InvalidImageError` (400) naming `param` otherwise."""
    if not url.startswith("data:"):
        scheme = url.split(":", 1)[0] if ":" in url else "(none)"
        raise InvalidImageError(
            f"Unsupported image URL scheme {scheme!r}: send images as data:image/...;base64 URLs.",
            param=param,
        )
    match = _DATA_URL.match(url)
    if match is None:
        raise InvalidImageError("Image data URL must look like data:image/<type>;base64,<data>.", param=param)
    payload = match.group("payload")
    if len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise InvalidImageError(f"Image is larger than {MAX_IMAGE_BYTES} bytes.", param=param)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidImageError("Image data URL is not valid base64.", param=param) from None
    check_image(data, param=param)
    return data


def check_image(data: bytes, *, param: str) -> None:
    """Header-only check: a known format and a bounded pixel count, without decoding pixels."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as img:
                fmt, (width, height) = img.format, img.size
    except Exception:
        raise InvalidImageError("Image bytes are not a readable image.", param=param) from None
    if fmt not in ALLOWED_FORMATS:
        raise InvalidImageError(f"Image format {fmt} is not supported (PNG, JPEG, WEBP, GIF).", param=param)
    if width * height > MAX_IMAGE_PIXELS:
        raise InvalidImageError(f"Image has {width}x{height} pixels; the limit is {MAX_IMAGE_PIXELS}.", param=param)


def decode_rgb(data: bytes) -> Image.Image:
    """Full decode for the captioner: first frame, RGB."""
    with Image.open(io.BytesIO(data)) as img:
        img.seek(0)
        return img.convert("RGB")

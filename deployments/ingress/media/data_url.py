"""Data URLs (``data:<media type>[;parameters];base64,<data>``) decoded once for images and documents."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Literal

_HEAD = re.compile(r"^data:(?P<media>[^;,]*)(?P<params>(;[^;,]*)*?);base64$")  # before the first comma


class DataURLError(ValueError):
    """Why a data URL was refused: ``shape`` (not a base64 data URL, or not of the media type asked
    for), ``size`` (over the cap; `size` is the decoded length, None when the payload alone shows it)
    or ``base64``. The caller says it in its own words.
    """

    def __init__(self, why: Literal["shape", "size", "base64"], size: int | None = None) -> None:
        super().__init__(why)
        self.why, self.size = why, size


def decode_data_url(
    url: str, cap: int, *, media: re.Pattern[str] | None = None, bare: bool = False
) -> tuple[bytes, str]:
    """A data URL's bytes (at most `cap`) and its media type (lower case). `media`: the media type
    with its parameters must match it in full; `bare`: a string that is not a data URL is taken as
    the base64 payload of one with no media type (as some clients send a document's `file_data`).
    Only the head is matched by a regex (a regex over a 32 MB payload costs 0.1 s).
    """
    if url.startswith("data:"):
        head, comma, payload = url.partition(",")
    elif bare:
        head, comma, payload = "data:;base64", ",", url
    else:
        raise DataURLError("shape")
    found = _HEAD.match(head)
    if found is None or not comma:
        raise DataURLError("shape")
    if media is not None and not media.fullmatch(found.group("media") + found.group("params")):
        raise DataURLError("shape")
    if len(payload) > cap * 4 // 3 + 4:
        raise DataURLError("size")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise DataURLError("base64") from None
    if len(data) > cap:
        raise DataURLError("size", len(data))
    return data, found.group("media").strip().lower()

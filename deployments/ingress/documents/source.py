"""A document part's bytes and name, from wherever the request says they are: `file_data` (a
``data:<media type>;base64,`` URL), `file_id` (a /v1/files upload of the caller's: another API key's
file is not found, the 404 of an unknown id) or `file_url` (http(s) only, through the image URLs'
SSRF guard, timeouts and redirects (`media.fetch`), capped at `documents.max_document_bytes`). What the bytes are is
read from them (a PDF starts with ``%PDF-``), not trusted from a media type or a name; anything else
must be UTF-8 text. Every failure is an `InvalidDocumentError` (400) naming the document and the part.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from deployments.config import DocumentInputConfig, ImageInputConfig
from deployments.errors import InvalidDocumentError, InvalidImageError
from deployments.ingress.media.data_url import DataURLError, decode_data_url
from deployments.ingress.media.fetch import fetch_remote
from deployments.protocol.openai.common import FileInput
from deployments.state.owners import Caller

_PDF_MAGIC = b"%PDF-"
_TEXT_TYPES = ("text/", "application/json", "application/csv", "application/x-ndjson", "application/markdown")


class FileSource(Protocol):
    """What the document stage needs of /v1/files (`state.files.FileStore`)."""

    def retrieve(self, file_id: str, caller: Caller) -> dict[str, Any]: ...

    def content(self, file_id: str, caller: Caller) -> Iterator[bytes]: ...


@dataclass(frozen=True)
class DocumentBytes:
    """A document's bytes, its name as the prompt shows it and what it is (``pdf`` or ``text``)."""

    data: bytes
    name: str
    kind: str


def _kind(data: bytes, media_type: str | None, name: str, *, param: str) -> str:
    said_pdf = media_type == "application/pdf" or name.lower().endswith(".pdf")
    # A PDF's header may follow up to 1 KB of junk; text that merely quotes it early stays text.
    if data.lstrip(b"\x00\t\n\r\f ")[:5] == _PDF_MAGIC or (said_pdf and data[:1024].find(_PDF_MAGIC) >= 0):
        return "pdf"
    if said_pdf:
        raise InvalidDocumentError(f"Document {name!r} is not a readable PDF (no %PDF- header).", param=param)
    if media_type and not media_type.startswith(_TEXT_TYPES) and media_type != "application/octet-stream":
        raise InvalidDocumentError(
            f"Document {name!r} has media type {media_type!r}; PDF and text documents (plain text, Markdown, CSV) "
            "are supported.",
            param=param,
        )
    return "text"


def _decode(url: str, name: str, cap: int, *, param: str) -> tuple[bytes, str]:
    """A data URL's bytes and media type; bare base64 (as some clients send Responses' `file_data`)
    is taken as the payload of one with no media type.
    """
    try:
        return decode_data_url(url, cap, bare=True)
    except DataURLError as exc:
        if exc.why == "size":
            raise _too_large(name, exc.size, cap, param) from None
        if exc.why == "base64":
            raise InvalidDocumentError(f"Document {name!r}: file_data is not valid base64.", param=param) from None
        raise InvalidDocumentError(
            f"Document {name!r}: file_data must be a data URL, data:<media type>;base64,<data>.", param=param
        ) from None


def _too_large(name: str, size: int | None, cap: int, param: str) -> InvalidDocumentError:
    what = f"is {size} bytes" if size is not None else f"is larger than {cap} bytes"
    return InvalidDocumentError(
        f"Document {name!r} {what}; the limit is {cap} bytes (documents.max_document_bytes).", param=param
    )


def _read_upload(files: FileSource, file_id: str, caller: Caller, cap: int, *, param: str) -> tuple[bytes, str]:
    found = files.retrieve(file_id, caller)  # 404 unless the caller's
    name = str(found.get("filename") or file_id)
    if int(found.get("bytes") or 0) > cap:
        raise _too_large(name, int(found["bytes"]), cap, param)
    data = bytearray()
    for chunk in files.content(file_id, caller):
        data += chunk
        if len(data) > cap:
            raise _too_large(name, None, cap, param)
    return bytes(data), name


async def load_document(
    part: FileInput,
    index: int,
    config: DocumentInputConfig,
    images: ImageInputConfig,
    files: FileSource | None,
    caller: Caller,
    *,
    param: str,
) -> DocumentBytes:
    """The bytes of the request's `index`-th document (0-based, for its default name)."""
    cap = config.max_document_bytes
    name = part.filename or f"document {index + 1}"
    media: str | None = None
    if part.file_data is not None:
        data, media = await asyncio.to_thread(_decode, part.file_data, name, cap, param=f"{param}.file_data")
    elif part.file_id is not None:
        if files is None:
            raise InvalidDocumentError(
                "file_id names a /v1/files upload, and this server keeps no files (server.batches).",
                param=f"{param}.file_id",
            )
        data, stored = await asyncio.to_thread(_read_upload, files, part.file_id, caller, cap, param=param)
        name = part.filename or stored
    else:
        assert part.file_url is not None
        url = part.file_url
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme not in ("http", "https"):
            raise InvalidDocumentError(
                f"Document URL scheme {scheme or '(none)'!r} is not supported: use http(s):// or file_data.",
                param=f"{param}.file_url",
            )
        fetch = images.model_copy(update={"max_image_bytes": cap})
        try:
            data = await fetch_remote(
                url, fetch, param=f"{param}.file_url", noun="Document", accept="application/pdf, text/*;q=0.9"
            )
        except InvalidImageError as exc:
            raise InvalidDocumentError(exc.message, param=exc.param) from None
        if not part.filename:
            name = url.rsplit("/", 1)[-1].split("?", 1)[0] or name
    return DocumentBytes(data, name, _kind(data, media, name, param=param))

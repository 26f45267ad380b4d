"""Documents read into pages, off the ingress's event loop and under bounds.

A PDF is read by one of a few long-lived worker processes (`worker.py`, started on first use: a
Python process with PDFium loaded, about 0.1 s), one PDF at a time each, so that parsing never holds
the event loop nor the GIL of the ingress, and so that what a hostile file can do is bounded by the
process: its memory by RLIMIT_AS (`documents.parse_memory_mb`), its time by a deadline after which
it is killed (`documents.parse_timeout_s`). A worker that crashed, ran out of memory, overran its
deadline or whose request was cancelled is killed and replaced by a fresh one on the next use: its
state is never trusted again. Every failure is an `InvalidDocumentError` (400) naming the document.

Text documents (plain text, Markdown, CSV) need no parser: their bytes are decoded as UTF-8 in a
thread and cut at line ends into parts (`documents.text_part_chars`), which play the part of pages.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from deployments.config import DocumentInputConfig
from deployments.errors import InvalidDocumentError

logger = logging.getLogger("ray.serve")

WORKER = Path(__file__).with_name("worker.py")
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Page:
    """One page: its text (None: not read, past the characters one request may read) and, for a
    page with little or no text, its rendering as a PNG (None when not rendered)."""

    text: str | None
    image: bytes | None = None

    @property
    def size(self) -> int:
        return len(self.text or "") + len(self.image or b"")


@dataclass(frozen=True)
class ReadDocument:
    """A document's pages, in order; `kind` says what they are (PDF pages or a text file's parts)."""

    kind: str  # "pdf" | "text"
    pages: tuple[Page, ...]

    @property
    def size(self) -> int:
        return sum(page.size for page in self.pages) + 64 * len(self.pages)


def text_parts(text: str, part_chars: int) -> list[str]:
    """`text` cut into parts of about `part_chars` characters, at line ends (a line longer than that
    is cut where it reaches the size)."""
    parts: list[str] = []
    current: list[str] = []
    size = 0
    for line in text.splitlines(keepends=True):
        while len(line) > part_chars:
            if current:
                parts.append("".join(current))
                current, size = [], 0
            parts.append(line[:part_chars])
            line = line[part_chars:]
        if size + len(line) > part_chars and current:
            parts.append("".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line)
    if current:
        parts.append("".join(current))
    return [part.strip("\n") for part in parts] or [""]


def read_text(data: bytes, name: str, config: DocumentInputConfig, *, param: str) -> ReadDocument:
    """A text document's parts; a 400 when its bytes are not UTF-8 text."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InvalidDocumentError(
            f"Document {name!r} is neither a PDF nor UTF-8 text (plain text, Markdown, CSV).", param=param
        ) from None
    if "\x00" in text:
        raise InvalidDocumentError(f"Document {name!r} is binary, not text.", param=param)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return ReadDocument("text", tuple(Page(part) for part in text_parts(text, config.text_part_chars)))


class _Worker:
    """One worker process and its pipes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, memory_mb: int) -> _Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",  # isolated: no PYTHONPATH, no user site, not the working directory on sys.path
            str(WORKER),
            str(memory_mb),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(process)

    async def ask(self, limits: dict[str, int], data: bytes, answer_cap: int) -> dict:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        head = json.dumps(limits).encode()
        stdin.write(len(head).to_bytes(4, "big") + head + len(data).to_bytes(8, "big") + data)
        await stdin.drain()
        size = int.from_bytes(await stdout.readexactly(8), "big")
        if size > answer_cap:
            raise ValueError(f"worker answer of {size} bytes")
        answer: dict = json.loads(await stdout.readexactly(size))
        return answer

    async def kill(self) -> int | None:
        if self.process.returncode is None:
            self.process.kill()
        return await self.process.wait()


class DocumentWorkers:
    """The worker processes of one ingress replica (`documents.workers` at most, started on use)."""

    def __init__(self, config: DocumentInputConfig) -> None:
        self._config = config
        self._idle: list[_Worker] = []
        self._slots = asyncio.Semaphore(config.workers)

    async def read_pdf(self, data: bytes, name: str, *, param: str) -> ReadDocument:
        """The PDF's pages (text, and renderings of pages with little text); a 400 naming `name` when
        it is encrypted, malformed, has more pages than a request may carry, or cannot be read within
        the worker's memory and time."""
        config = self._config
        limits = {
            "max_pages": config.max_pages_per_request,
            "max_chars": config.max_chars_per_request,
            "min_page_chars": config.min_page_chars,
            "render_max_side": config.render_max_side,
            "max_rendered_pages": config.max_rendered_pages,
        }
        # Text is at most max_chars plus a page, JSON-escaped; each rendering at most 4 bytes a pixel, base64.
        answer_cap = 64 * config.max_chars_per_request + config.max_rendered_pages * config.render_max_side**2 * 6
        answer_cap += 64 * 1024 * 1024
        async with self._slots:
            worker = self._idle.pop() if self._idle else await _Worker.start(config.parse_memory_mb)
            try:
                async with asyncio.timeout(config.parse_timeout_s):
                    answer = await worker.ask(limits, data, answer_cap)
            except TimeoutError:
                await worker.kill()
                raise InvalidDocumentError(
                    f"Document {name!r} could not be read within {config.parse_timeout_s:g} s "
                    "(documents.parse_timeout_s).",
                    param=param,
                ) from None
            except (asyncio.IncompleteReadError, ConnectionError, ValueError):
                code = await worker.kill()
                logger.warning("document %r: the PDF worker ended (exit status %s)", name, code)
                raise _too_big(name, config, param) from None
            except BaseException:  # cancelled: the worker is mid-file; never reused
                await worker.kill()
                raise
            self._idle.append(worker)
        return _pages(answer, name, config, param)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for worker in idle:
            await worker.kill()


def _too_big(name: str, config: DocumentInputConfig, param: str) -> InvalidDocumentError:
    return InvalidDocumentError(
        f"Document {name!r} could not be read: it is malformed or needs more than {config.parse_memory_mb} MB to "
        "read (documents.parse_memory_mb).",
        param=param,
    )


def _pages(answer: dict, name: str, config: DocumentInputConfig, param: str) -> ReadDocument:
    if not answer.get("ok"):
        error = answer.get("error")
        if error == "encrypted":
            message = f"Document {name!r} is encrypted (password protected); send it without a password."
        elif error == "too_many_pages":
            message = (
                f"Document {name!r} has {answer.get('pages')} pages; a request may carry at most "
                f"{config.max_pages_per_request} (documents.max_pages_per_request)."
            )
        elif error == "memory":
            raise _too_big(name, config, param)
        else:
            message = f"Document {name!r} is not a readable PDF (malformed or damaged)."
        raise InvalidDocumentError(message, param=param)
    pages = []
    for page in answer["pages"]:
        image = base64.b64decode(page["image"]) if page.get("image") else None
        if image is not None and not image.startswith(_PNG_MAGIC):
            image = None
        text = page.get("text")
        pages.append(Page(text if isinstance(text, str) else None, image))
    return ReadDocument("pdf", tuple(pages))

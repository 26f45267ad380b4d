"""Documents read into pages, off the ingress's event loop and under bounds.

A PDF is read by one of a few long-lived worker processes (`worker.py`, started on first use: a
Python process with PDFium loaded, about 0.1 s), one PDF at a time each, so that parsing never holds
the event loop nor the GIL of the ingress, and so that what a hostile file can do is bounded by the
process: its memory by RLIMIT_AS (`documents.parse_memory_mb`), its time by a deadline after which
it is killed (`documents.parse_timeout_s`). A worker that crashed, ran out of memory, overran its
deadline or whose request was cancelled is killed and replaced by a fresh one on the next use: its
state is never trusted again. Every failure is an `InvalidDocumentError` (400) naming the document;
a full queue (`DocumentWorkers`) is an `OverloadedError` (503, with Retry-After).

Text documents (plain text, Markdown, CSV) need no parser: their bytes are decoded as UTF-8 in a
thread and cut at line ends into parts (`documents.text_part_chars`), which play the part of pages,
in one linear pass; parts past `documents.max_chars_per_request` are counted, not kept.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployments.config import DocumentInputConfig
from deployments.errors import InvalidDocumentError, OverloadedError

logger = logging.getLogger("ray.serve")

WORKER = Path(__file__).with_name("worker.py")
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Page:
    """One page: its text (None: not read, past the characters one request may read) and, for a
    page with little or no text, its rendering as a PNG (None when not rendered).
    """

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


def text_parts(text: str, part_chars: int) -> Iterator[str]:
    """`text` cut into parts of at most `part_chars` characters, each ending at its last line end (a
    line longer than that is cut where it reaches the size). Linear in the text: one scan for line
    ends per part, no list of lines (12 M short lines would be 12 M strings).
    """
    end_of_text = len(text)
    start = 0
    while start < end_of_text:
        end = min(start + part_chars, end_of_text)
        if end < end_of_text:
            cut = text.rfind("\n", start, end + 1)  # the part's last line end (one right at its end included)
            if cut > start:
                end = cut + 1
        yield text[start:end]
        start = end


def read_text(data: bytes, name: str, config: DocumentInputConfig, *, param: str) -> ReadDocument:
    """A text document's parts; a 400 when its bytes are not UTF-8 text. The parts past
    `max_chars_per_request` characters are counted but not kept (their text None, as a PDF's pages
    past it are not read): what the reading holds is bounded by the setting, not by the document.
    """
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InvalidDocumentError(
            f"Document {name!r} is neither a PDF nor UTF-8 text (plain text, Markdown, CSV).", param=param
        ) from None
    if "\x00" in text:
        raise InvalidDocumentError(f"Document {name!r} is binary, not text.", param=param)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    pages: list[Page] = []
    chars = 0
    for part in text_parts(text, config.text_part_chars):
        if chars > config.max_chars_per_request:
            pages.append(Page(None))
            continue
        part = part.strip("\n")
        chars += len(part)
        pages.append(Page(part))
    return ReadDocument("text", tuple(pages) or (Page(""),))


class _Worker:
    """One worker process and its pipes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, script: Path, memory_mb: int) -> _Worker:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",  # isolated: no PYTHONPATH, no user site, not the working directory on sys.path
            str(script),
            str(memory_mb),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(process)

    async def ask(self, limits: dict[str, Any], data: bytes, answer_cap: int) -> dict:
        """The worker's answer, each page's `image` its PNG's bytes (framing: `worker`); ValueError
        when the answer is over `answer_cap` or does not add up.
        """
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        head = json.dumps(limits).encode()
        stdin.write(len(head).to_bytes(4, "big") + head + len(data).to_bytes(8, "big") + data)
        await stdin.drain()
        size = int.from_bytes(await stdout.readexactly(8), "big")
        if size > answer_cap:
            raise ValueError(f"worker answer of {size} bytes")
        answer: dict = json.loads(await stdout.readexactly(size))
        images = int.from_bytes(await stdout.readexactly(8), "big")
        if size + images > answer_cap:
            raise ValueError(f"worker answer of {size + images} bytes")
        blob = memoryview(await stdout.readexactly(images)) if images else memoryview(b"")
        pages, at = answer.get("pages"), 0
        for page in pages if isinstance(pages, list) else []:
            length = page.get("image") if isinstance(page, dict) else None
            if length is None:
                continue
            if not isinstance(length, int) or not 0 <= length <= len(blob) - at:
                raise ValueError("worker answer's images do not add up")
            page["image"], at = bytes(blob[at : at + length]), at + length
        if at != len(blob):
            raise ValueError("worker answer's images do not add up")
        return answer

    async def kill(self) -> int | None:
        if self.process.returncode is None:
            self.process.kill()
        return await self.process.wait()


class RequestReads:
    """One request's share of the workers: at most `documents.max_reads_per_request` of its PDFs
    waiting for a worker or being read at once; its other PDFs wait here, outside the replica's
    queue, so that one request cannot fill it nor stand in front of every other request.
    """

    def __init__(self, config: DocumentInputConfig) -> None:
        self.slots = asyncio.Semaphore(config.max_reads_per_request)


@dataclass
class WorkerStats:
    """What the workers did: jobs sent to a worker (`started`), jobs that never reached one because
    their requests left first (`dropped`), workers killed mid-job because every request waiting for
    the job had left (`stopped`), and requests refused because the queue was full (`refused`).
    """

    started: int = 0
    dropped: int = 0
    stopped: int = 0
    refused: int = 0


class DocumentWorkers:
    """The worker processes of one ingress replica (`documents.workers` at most, started on use) and
    their queue, bounded: `documents.max_queued_reads` PDFs waiting for a worker, all requests
    together (beyond, a 503 `OverloadedError` with Retry-After), and each request's share of it
    (`RequestReads`). A job whose requests have all left (refused, cancelled) never starts if it is
    still queued, and its worker is killed if it has started: the worker is stopped, not left to
    finish a result nobody will read, because a hostile PDF holds it for up to
    `documents.parse_timeout_s` and that is the time every queued reader would wait (a fresh worker
    costs about 0.1 s).
    """

    def __init__(self, config: DocumentInputConfig, script: Path | None = None) -> None:
        """`script`: the worker's program (default `WORKER`; tests put a scripted one in its place)."""
        self._config = config
        self._script = script or WORKER
        self._idle: list[_Worker] = []
        self._slots = asyncio.Semaphore(config.workers)
        self.queued = 0  # jobs waiting for a worker
        self.running = 0  # jobs in a worker
        self.stats = WorkerStats()
        self._job_s = 1.0  # a moving average of a job's time, for Retry-After
        self._starting: asyncio.Future[_Worker] | None = None  # a spare worker being started
        self._closed = False

    def _limits(self) -> dict[str, Any]:
        config = self._config
        return {
            "max_pages": config.max_pages_per_request,
            "max_chars": config.max_chars_per_request,
            "min_page_chars": config.min_page_chars,
            "render_max_side": config.render_max_side,
            "max_rendered_pages": config.max_rendered_pages,
        }

    async def count_pages(self, data: bytes, name: str, *, param: str, reads: RequestReads | None = None) -> int:
        """The PDF's page count, from its page tree (no page is read): a 400 naming `name` when it is
        encrypted, malformed or has more pages than a request may carry.
        """
        answer = await self._job({**self._limits(), "count_only": True}, data, name, param, reads)
        if not answer.get("ok"):
            raise _refusal(answer, name, self._config, param)
        return int(answer["page_count"])

    async def read_pdf(self, data: bytes, name: str, *, param: str, reads: RequestReads | None = None) -> ReadDocument:
        """The PDF's pages (text, and renderings of pages with little text); a 400 naming `name` when
        it is encrypted, malformed, has more pages than a request may carry, or cannot be read within
        the worker's memory and time; a 503 when the replica's queue of PDFs is full.
        """
        return _pages(await self._job(self._limits(), data, name, param, reads), name, self._config, param)

    async def _job(
        self, limits: dict[str, Any], data: bytes, name: str, param: str, reads: RequestReads | None
    ) -> dict:
        config = self._config
        if reads is None:
            reads = RequestReads(config)
        async with reads.slots:
            if self.queued >= config.max_queued_reads:
                self.stats.refused += 1
                error = OverloadedError(
                    f"Document {name!r} cannot be read now: {self.queued} PDFs are waiting for this replica's "
                    f"{config.workers} reader(s) (documents.max_queued_reads); retry shortly."
                )
                error.retry_after_s = max(1, math.ceil(self.queued * self._job_s / config.workers))
                raise error
            self.queued += 1
            try:
                await self._slots.acquire()
            except BaseException:
                self.stats.dropped += 1  # left while queued: never started
                raise
            finally:
                self.queued -= 1
            try:
                return await self._in_worker(limits, data, name, param)
            finally:
                self._slots.release()

    async def _in_worker(self, limits: dict[str, Any], data: bytes, name: str, param: str) -> dict:
        config = self._config
        # Text is at most max_chars plus a page, JSON-escaped; each rendering at most 4 bytes a pixel.
        answer_cap = 64 * config.max_chars_per_request + config.max_rendered_pages * config.render_max_side**2 * 4
        answer_cap += 64 * 1024 * 1024
        worker = self._idle.pop() if self._idle else await self._start()
        self.running += 1
        self.stats.started += 1
        began = time.monotonic()
        try:
            async with asyncio.timeout(config.parse_timeout_s):
                answer = await worker.ask(limits, data, answer_cap)
        except TimeoutError:
            await worker.kill()
            raise InvalidDocumentError(
                f"Document {name!r} could not be read within {config.parse_timeout_s:g} s (documents.parse_timeout_s).",
                param=param,
            ) from None
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            code = await worker.kill()
            logger.warning("document %r: the PDF worker ended (exit status %s)", name, code)
            raise _too_big(name, config, param) from None
        except BaseException:  # cancelled: the worker is mid-file; never reused
            self.stats.stopped += 1
            await asyncio.shield(worker.kill())
            self._spare()
            raise
        finally:
            self.running -= 1
            self._job_s = 0.8 * self._job_s + 0.2 * (time.monotonic() - began)
        self._idle.append(worker)
        return answer

    async def _start(self) -> _Worker:
        """A fresh worker: the spare being started, if any, else a new one. A start whose job is
        cancelled joins the idle ones (never an orphan process).
        """
        if self._starting is not None:
            starting, self._starting = self._starting, None
            starting.remove_done_callback(self._keep)
        else:
            starting = asyncio.ensure_future(_Worker.start(self._script, self._config.parse_memory_mb))
        try:
            return await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(self._keep)
            raise

    def _spare(self) -> None:
        """Start a worker in place of one just killed, so that the next reader finds it warm (a
        start is about 0.1-0.3 s, most of a one-page PDF's reading).
        """
        if self._starting is None and not self._closed:
            self._starting = asyncio.ensure_future(_Worker.start(self._script, self._config.parse_memory_mb))
            self._starting.add_done_callback(self._keep)

    def _keep(self, starting: asyncio.Future[_Worker]) -> None:
        if self._starting is starting:
            self._starting = None
        if not starting.cancelled() and starting.exception() is None:
            worker = starting.result()
            if self._closed:
                worker.process.kill()
            else:
                self._idle.append(worker)

    async def close(self) -> None:
        self._closed = True
        if self._starting is not None:
            (spare,) = await asyncio.gather(self._starting, return_exceptions=True)
            if isinstance(spare, _Worker):
                await spare.kill()
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
        raise _refusal(answer, name, config, param)
    pages = []
    for page in answer["pages"]:
        image = page.get("image")
        if not isinstance(image, bytes) or not image.startswith(_PNG_MAGIC):
            image = None
        text = page.get("text")
        pages.append(Page(text if isinstance(text, str) else None, image))
    return ReadDocument("pdf", tuple(pages))


def _refusal(answer: dict, name: str, config: DocumentInputConfig, param: str) -> InvalidDocumentError:
    """The 400 of a worker's refusal (`{"ok": false, "error": ...}`)."""
    error = answer.get("error")
    if error == "encrypted":
        message = f"Document {name!r} is encrypted (password protected); send it without a password."
    elif error == "too_many_pages":
        message = (
            f"Document {name!r} has {answer.get('pages')} pages; a request may carry at most "
            f"{config.max_pages_per_request} (documents.max_pages_per_request)."
        )
    elif error == "memory":
        return _too_big(name, config, param)
    else:
        message = f"Document {name!r} is not a readable PDF (malformed or damaged)."
    return InvalidDocumentError(message, param=param)

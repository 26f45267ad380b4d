"""The document stage: a chat's documents become text (and page images) in their place, before the
image pipeline, so that every model reads them, and a page without text is captioned or shown
exactly as an image part would be (the same caps, cache, degraded answer).

Each `file` part of a user message becomes, in place: per page a mark and its text
(``[document a.pdf, page 3 of 12]``; a text document's parts are its pages), and for a page with
little or no text (a scan, a figure) its rendering as an image part after the mark, while the
request's image limits leave room (`ImageRoom`; without vision, or beyond the limits, a mark that
the page was not seen, and why). Pages the model does not read are named in the answer
(`vision.unseen_pages`) and in the prompt: beyond what the model's context leaves (`fit`) or
`documents.max_chars_per_request`, whole pages are left out from the end of the request (never half
a page, as an image is never split).

Caps that refuse the request (a 400 naming the document, in each API's shape), each checked before
the work it bounds: more documents than `max_documents_per_request` (before any is loaded), a
document over `max_document_bytes` (while it is loaded), more PDF pages in the request than
`max_pages_per_request` (from every PDF's page tree, before any page is read), and a document that
cannot be read (encrypted, malformed, hostile: see `reader`). A full queue of PDFs is a 503.

A request's work is all or nothing: when one document fails, or the request is cancelled (the
client left, its deadline passed), its other loads and reads are cancelled, except readings that
another request waits for too (`cache`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from deployments.config import DocumentInputConfig, ImageInputConfig
from deployments.errors import InvalidDocumentError
from deployments.ingress.documents.cache import DocumentCache, document_key
from deployments.ingress.documents.fit import ContextFit, fit_documents
from deployments.ingress.documents.reader import DocumentWorkers, Page, ReadDocument, RequestReads, read_text
from deployments.ingress.documents.source import DocumentBytes, FileSource, load_document
from deployments.ingress.media.cache import CacheStats, MetricSink
from deployments.ingress.media.chat import ImageBytesPart, parts_of, user_lists
from deployments.ingress.media.unseen import WHY, unseen_page_marker
from deployments.protocol.openai.chat import ChatMessage, UserMessage
from deployments.protocol.openai.common import FilePart, ImagePart, ImageURL, PageUnseenReason, TextPart, UnseenPage
from deployments.state.owners import Caller


@dataclass(frozen=True)
class PageRef:
    """A page of the request's `document`-th document (0-based), `page` 1-based."""

    document: int
    filename: str
    page: int

    def unseen(self, reason: PageUnseenReason) -> UnseenPage:
        return UnseenPage(document=self.document, filename=self.filename, page=self.page, reason=reason)


@dataclass
class ImageRoom:
    """How many more images the request (and each message) may carry: the image limits less the
    images the user sent.
    """

    request: int
    per_message: dict[int, int]

    @classmethod
    def of(cls, messages: list[ChatMessage], limits: ImageInputConfig) -> ImageRoom:
        used = {i: sum(isinstance(p, ImagePart) for p in m.content) for i, m in user_lists(messages)}
        room = {i: limits.max_images_per_message - n for i, n in used.items()}
        return cls(limits.max_images_per_request - sum(used.values()), room)

    def take(self, message: int) -> bool:
        if self.request <= 0 or self.per_message.get(message, 0) <= 0:
            return False
        self.request -= 1
        self.per_message[message] -= 1
        return True


@dataclass(frozen=True)
class Expanded:
    """The chat with its documents read into it; the pages not seen; and for each page image put in
    (by the image part's identity), the page it shows.
    """

    messages: list[ChatMessage]
    unseen: list[UnseenPage] = field(default_factory=list)
    page_images: dict[int, PageRef] = field(default_factory=dict)
    document_chars: int = 0  # the page text put in


T = TypeVar("T")


async def all_or_none(work: Iterable[Awaitable[T]]) -> list[T]:
    """Every result, in order; when one fails (or the caller is cancelled), the others are cancelled
    and awaited before the error is raised as it is (`asyncio.gather` leaves them running).
    """
    tasks = [asyncio.ensure_future(one) for one in work]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def file_parts(messages: list[ChatMessage]) -> list[tuple[int, int, FilePart]]:
    """`(message index, part index, part)` of every document, in conversation order."""
    return list(parts_of(messages, FilePart))


def count_documents(messages: list[ChatMessage]) -> int:
    """The number of document (`file`) parts in the messages."""
    return len(file_parts(messages))


class DocumentStage:
    """The documents of one ingress replica: their workers, their cache and where `file_id`s are."""

    def __init__(
        self,
        config: DocumentInputConfig,
        images: ImageInputConfig,
        files: FileSource | None = None,
        metrics: MetricSink | None = None,
    ) -> None:
        """`metrics`: the ingress's, for the cache's counters and gauges (``document_cache_*``)."""
        self.config = config
        self._images = images
        self.files = files
        self._metrics = metrics
        self.workers = DocumentWorkers(config)
        self.cache = DocumentCache(config.cache_entries, int(config.cache_mb * 1024 * 1024))

    async def read(
        self, source: DocumentBytes, *, param: str, key: str | None = None, reads: RequestReads | None = None
    ) -> ReadDocument:
        """A document's pages, from the cache or read now; `reads`: the request's share of the workers."""

        async def read() -> ReadDocument:
            if source.kind == "pdf":
                return await self.workers.read_pdf(source.data, source.name, param=param, reads=reads)
            return await asyncio.to_thread(read_text, source.data, source.name, self.config, param=param)

        if key is None:
            key = await asyncio.to_thread(document_key, source.data, source.kind)
        stats = CacheStats()
        try:
            return await self.cache.get_or_make(key, read, stats)
        finally:
            if self._metrics is not None:
                self.cache.export(self._metrics, "document_cache", stats)

    async def _pages(self, source: DocumentBytes, key: str, reads: RequestReads, *, param: str) -> int:
        """A PDF's page count: its reading's when cached, else from its page tree (no page read)."""
        if (cached := self.cache.peek(key)) is not None:
            return len(cached.pages)
        return await self.workers.count_pages(source.data, source.name, param=param, reads=reads)

    async def expand(
        self,
        messages: list[ChatMessage],
        caller: Caller,
        image_limits: ImageInputConfig | None,
        fit: ContextFit | None = None,
    ) -> Expanded:
        """`messages` with each document read in place. `image_limits`: the limits the page images
        count against (None: the model takes no images, and pages without text are not seen);
        `fit`: the model's context, which the pages are fitted to (None: the character cap alone).
        """
        found = file_parts(messages)
        if not found:
            return Expanded(messages)
        config = self.config
        if len(found) > config.max_documents_per_request:
            raise InvalidDocumentError(
                f"The request has {len(found)} documents; the limit is {config.max_documents_per_request} "
                "(documents.max_documents_per_request).",
                param="messages",
            )
        params = [f"messages[{i}].content[{j}].file" for i, j, _ in found]
        reads = RequestReads(config)

        async def load(index: int, part: FilePart) -> tuple[DocumentBytes, str]:
            source = await load_document(
                part.file, index, config, self._images, self.files, caller, param=params[index]
            )
            return source, await asyncio.to_thread(document_key, source.data, source.kind)

        loaded = await all_or_none(load(k, part) for k, (_, _, part) in enumerate(found))
        pdfs = [k for k, (source, _) in enumerate(loaded) if source.kind == "pdf"]
        counts = await all_or_none(self._pages(*loaded[k], reads, param=params[k]) for k in pdfs)
        if sum(counts) > config.max_pages_per_request:
            named = ", ".join(f"{loaded[k][0].name!r}: {n}" for k, n in zip(pdfs, counts, strict=True))
            raise InvalidDocumentError(
                f"The request's documents have {sum(counts)} pages ({named}); the limit is "
                f"{config.max_pages_per_request} (documents.max_pages_per_request).",
                param="messages",
            )
        read: dict[int, ReadDocument] = {}
        for kind in ("text", "pdf"):  # text first: a bad text document refuses the request before any PDF is read
            mine = [k for k, (source, _) in enumerate(loaded) if source.kind == kind]
            done = await all_or_none(
                self.read(loaded[k][0], param=params[k], key=loaded[k][1], reads=reads) for k in mine
            )
            read.update(zip(mine, done, strict=True))
        documents = [(source, read[k]) for k, (source, _) in enumerate(loaded)]

        def compose(chars: int, keep_first: bool = True) -> Expanded:
            return self._compose(messages, found, documents, chars, image_limits, keep_first=keep_first)

        expanded = compose(config.max_chars_per_request, keep_first=False)
        if fit is None or not config.fit_to_context:
            return expanded
        rest = [_without_documents(msg) for msg in messages]
        return await fit_documents(expanded, compose, fit, rest)

    @staticmethod
    def _compose(
        messages: list[ChatMessage],
        found: list[tuple[int, int, FilePart]],
        documents: list[tuple[DocumentBytes, ReadDocument]],
        chars: int,
        image_limits: ImageInputConfig | None,
        *,
        keep_first: bool,
    ) -> Expanded:
        """The chat with its documents' pages in place, at most `chars` characters of page text (the
        first page kept whatever its size when `keep_first`).
        """
        room = None if image_limits is None else ImageRoom.of(messages, image_limits)
        writer = _Writer(chars, room, keep_first=keep_first)
        parts_at = {
            (i, j): writer.document(k, i, source, doc)
            for k, ((i, j, _), (source, doc)) in enumerate(zip(found, documents, strict=True))
        }
        out: list[ChatMessage] = []
        for i, msg in enumerate(messages):
            if not isinstance(msg, UserMessage) or not isinstance(msg.content, list):
                out.append(msg)
                continue
            content: list[TextPart | ImagePart | FilePart] = []
            for j, part in enumerate(msg.content):
                content.extend(parts_at.get((i, j), [part]))
            out.append(msg.model_copy(update={"content": content}))
        return Expanded(out, writer.unseen, writer.page_images, writer.used)


def _without_documents(msg: ChatMessage) -> ChatMessage:
    if not isinstance(msg, UserMessage) or not isinstance(msg.content, list):
        return msg
    return msg.model_copy(update={"content": [part for part in msg.content if not isinstance(part, FilePart)]})


class _Writer:
    """The parts of each document in turn, against the request's character budget and image room."""

    def __init__(self, chars: int, room: ImageRoom | None, *, keep_first: bool = False) -> None:
        self._chars = chars
        self._room = room
        self._keep_first = keep_first  # the request's first page, whatever its size
        self._full = False  # once a page is left out, every later page is too: truncation from the end
        self.used = 0
        self.unseen: list[UnseenPage] = []
        self.page_images: dict[int, PageRef] = {}

    def document(
        self, index: int, message: int, source: DocumentBytes, doc: ReadDocument
    ) -> list[TextPart | ImagePart | FilePart]:
        parts: list[TextPart | ImagePart | FilePart] = []
        total = len(doc.pages)
        left_out: list[int] = []
        for number, page in enumerate(doc.pages, 1):
            ref = PageRef(index, source.name, number)
            text = page.text
            first = self._keep_first and index == 0 and number == 1 and text is not None
            if not first and (self._full or text is None or len(text) > self._chars):
                self._full = True
                left_out.append(number)
                self.unseen.append(ref.unseen("truncated"))
                continue
            self._chars -= len(text or "")
            self.used += len(text or "")
            mark = _mark(source, number, total)
            parts.append(TextPart(type="text", text=f"{mark}\n{text}" if text else mark))
            if page.image is not None or _image_only(page, doc):
                parts += self._image(ref, message, page)
        if left_out:
            parts.append(TextPart(type="text", text=_left_out(source, left_out, total)))
        return parts

    def _image(self, ref: PageRef, message: int, page: Page) -> list[TextPart | ImagePart | FilePart]:
        reason: PageUnseenReason
        if page.image is None:
            reason = "not_rendered"
        elif self._room is None:
            reason = "vision_disabled"
        elif not self._room.take(message):
            reason = "over_image_limit"
        else:
            name = ImageURL(url=f"{ref.filename}#page={ref.page}")  # no URL: the bytes travel as they are
            part = ImageBytesPart(type="image_url", image_url=name, data=page.image)
            self.page_images[id(part)] = ref
            return [part]
        self.unseen.append(ref.unseen(reason))
        return [TextPart(type="text", text=unseen_page_marker(reason))]


def _image_only(page: Page, doc: ReadDocument) -> bool:
    """A PDF page that the worker would have rendered but did not (past `max_rendered_pages`)."""
    return doc.kind == "pdf" and page.image is None and not page.text


def _mark(source: DocumentBytes, number: int, total: int) -> str:
    if source.kind == "text" and total == 1:
        return f"[document {source.name}]"
    what = "page" if source.kind == "pdf" else "part"
    return f"[document {source.name}, {what} {number} of {total}]"


def _left_out(source: DocumentBytes, pages: list[int], total: int) -> str:
    what = "pages" if source.kind == "pdf" else "parts"
    span = f"{pages[0]}-{pages[-1]}" if len(pages) > 1 else str(pages[0])
    return (
        f"[document {source.name}: {what} {span} of {total} were left out ({WHY['truncated']}); "
        "you have not read them: do not guess what they say, and tell the user if asked about them.]"
    )

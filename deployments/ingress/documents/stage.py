"""The document stage: a chat's documents become text (and page images) in their place, before the
image pipeline, so that every model reads them, and a page without text is captioned or shown
exactly as an image part would be (the same caps, cache, degraded answer).

Each `file` part of a user message becomes, in place: per page a mark and its text
(``[document a.pdf, page 3 of 12]``; a text document's parts are its pages), and for a page with
little or no text (a scan, a figure) its rendering as an image part after the mark, while the
request's image limits leave room (`ImageRoom`; without vision, or beyond the limits, a mark that
the page was not seen, and why). Pages the model does not read are named in the answer
(`vision.unseen_pages`) and in the prompt: beyond `documents.max_chars_per_request`, whole pages
are left out from the end of the request (never half a page, as an image is never split).

Caps that refuse the request (a 400 naming the document, in each API's shape): more documents than
`max_documents_per_request`, a document over `max_document_bytes`, more PDF pages in the request
than `max_pages_per_request`, and a document that cannot be read (encrypted, malformed, hostile:
see `reader`)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from dataclasses import dataclass, field

from deployments.config import DocumentInputConfig, ImageInputConfig
from deployments.errors import InvalidDocumentError
from deployments.ingress.documents.cache import DocumentCache, document_key
from deployments.ingress.documents.reader import DocumentWorkers, Page, ReadDocument, read_text
from deployments.ingress.documents.source import DocumentBytes, FileSource, load_document
from deployments.protocol.openai.chat import ChatMessage, UserMessage
from deployments.protocol.openai.common import FilePart, ImagePart, ImageURL, PageUnseenReason, TextPart, UnseenPage
from deployments.state.owners import Caller

_WHY: dict[PageUnseenReason, str] = {
    "vision_disabled": "this model takes no images",
    "over_image_limit": "the request's image limit was reached",
    "not_rendered": "too many pages without text in this document",
    "truncated": "over the request's limit of document text",
    "captioner_unavailable": "the vision model is unavailable",
    "captioner_timeout": "the vision model did not answer in time",
}


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
    images the user sent."""

    request: int
    per_message: dict[int, int]

    @classmethod
    def of(cls, messages: list[ChatMessage], limits: ImageInputConfig) -> ImageRoom:
        used = {i: sum(isinstance(p, ImagePart) for p in m.content) for i, m in _user_lists(messages)}
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
    (by the image part's identity), the page it shows."""

    messages: list[ChatMessage]
    unseen: list[UnseenPage] = field(default_factory=list)
    page_images: dict[int, PageRef] = field(default_factory=dict)


def _user_lists(messages: list[ChatMessage]) -> Iterator[tuple[int, UserMessage]]:
    for i, msg in enumerate(messages):
        if isinstance(msg, UserMessage) and isinstance(msg.content, list):
            yield i, msg


def file_parts(messages: list[ChatMessage]) -> list[tuple[int, int, FilePart]]:
    """`(message index, part index, part)` of every document, in conversation order."""
    return [
        (i, j, part)
        for i, msg in _user_lists(messages)
        for j, part in enumerate(msg.content)
        if isinstance(part, FilePart)
    ]


def count_documents(messages: list[ChatMessage]) -> int:
    return len(file_parts(messages))


class DocumentStage:
    """The documents of one ingress replica: their workers, their cache and where `file_id`s are."""

    def __init__(self, config: DocumentInputConfig, images: ImageInputConfig, files: FileSource | None = None) -> None:
        self.config = config
        self._images = images
        self.files = files
        self.workers = DocumentWorkers(config)
        self.cache = DocumentCache(config.cache_entries, int(config.cache_mb * 1024 * 1024))

    async def read(self, source: DocumentBytes, *, param: str) -> ReadDocument:
        """A document's pages, from the cache or read now."""

        async def read() -> ReadDocument:
            if source.kind == "pdf":
                return await self.workers.read_pdf(source.data, source.name, param=param)
            return await asyncio.to_thread(read_text, source.data, source.name, self.config, param=param)

        key = await asyncio.to_thread(document_key, source.data, source.kind)
        return await self.cache.get_or_read(key, read)

    async def expand(
        self, messages: list[ChatMessage], caller: Caller, image_limits: ImageInputConfig | None
    ) -> Expanded:
        """`messages` with each document read in place. `image_limits`: the limits the page images
        count against (None: the model takes no images, and pages without text are not seen)."""
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

        async def one(index: int, i: int, j: int, part: FilePart) -> tuple[DocumentBytes, ReadDocument]:
            param = f"messages[{i}].content[{j}].file"
            source = await load_document(part.file, index, config, self._images, self.files, caller, param=param)
            return source, await self.read(source, param=param)

        read = await asyncio.gather(*(one(k, *where) for k, where in enumerate(found)))
        pdf_pages = sum(len(doc.pages) for source, doc in read if doc.kind == "pdf")
        if pdf_pages > config.max_pages_per_request:
            counts = ", ".join(f"{source.name!r}: {len(doc.pages)}" for source, doc in read if doc.kind == "pdf")
            raise InvalidDocumentError(
                f"The request's documents have {pdf_pages} pages ({counts}); the limit is "
                f"{config.max_pages_per_request} (documents.max_pages_per_request).",
                param="messages",
            )
        room = None if image_limits is None else ImageRoom.of(messages, image_limits)
        writer = _Writer(config.max_chars_per_request, room)
        parts_at = {
            (i, j): writer.document(k, i, source, doc)
            for k, ((i, j, _), (source, doc)) in enumerate(zip(found, read, strict=True))
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
        return Expanded(out, writer.unseen, writer.page_images)


class _Writer:
    """The parts of each document in turn, against the request's character budget and image room."""

    def __init__(self, chars: int, room: ImageRoom | None) -> None:
        self._chars = chars
        self._room = room
        self._full = False  # once a page is left out, every later page is too: truncation from the end
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
            if self._full or text is None or len(text) > self._chars:
                self._full = True
                left_out.append(number)
                self.unseen.append(ref.unseen("truncated"))
                continue
            self._chars -= len(text)
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
            url = "data:image/png;base64," + base64.b64encode(page.image).decode()
            part = ImagePart(type="image_url", image_url=ImageURL(url=url))
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
        f"[document {source.name}: {what} {span} of {total} were left out ({_WHY['truncated']}); "
        "you have not read them: do not guess what they say, and tell the user if asked about them.]"
    )


def unseen_page_marker(reason: PageUnseenReason) -> str:
    """What the decoder reads in place of a page image nobody described."""
    return (
        f"[This page has no text layer, and it could not be seen ({_WHY[reason]}). "
        "Do not guess what it shows; tell the user if asked about it.]"
    )

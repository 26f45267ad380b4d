"""The one place where a request's images become what the decoder gets, for every endpoint
(`VisionPipeline.prepare`).

A request's messages, in chat form (an API with another shape turns its input into chat messages
first), become the decoder's messages, and their images become:

- proxy vision: captions in place of the images (`media.chat.rewrite`), from the captioner (`client`); when the
  captioner is down, the request is a 503 (``reject``) or is answered without them (``degrade``):
  the decoder is told that the images were not seen (`media.unseen`), and the answer says
  which and why (`Degraded`: the `vision` field, `system_fingerprint`, the `X-Vision-Degraded`
  header, and `proxy_vision.degraded_notice` before the text when set);
- native vision: the images, checked here (within the model's own per-request limit), sent to the
  decoder itself with their places in the chat (`native`);
- a model without vision: a 400 for a request with images.

Documents come first (`documents.stage`): read into the chat as marked text, a page without text as
an image part that then goes the images' way (or, without vision, a mark that it was not seen); the
pages not seen join the answer's report (`vision.unseen_pages`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from deployments.config import ImageInputConfig, ProxyVisionConfig
from deployments.errors import CaptionerTimeout, CaptionerUnavailable, VisionDisabledError
from deployments.ingress.documents.fit import ContextFit
from deployments.ingress.documents.stage import DocumentStage, Expanded, count_documents
from deployments.ingress.media.cache import CacheStats
from deployments.ingress.media.chat import as_text, count_images, parts_of, rewrite
from deployments.ingress.media.unseen import unseen_marker, unseen_page_marker
from deployments.ingress.vision.client import Captioner
from deployments.ingress.vision.collect import check_image_counts, collect_images
from deployments.ingress.vision.native import native_messages
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.chat import ChatMessage
from deployments.protocol.openai.common import ImagePart, UnseenImage, UnseenPage, UnseenReason, VisionReport
from deployments.protocol.replica import ImageBytes, TextMessage
from deployments.state.owners import Caller

logger = logging.getLogger("ray.serve")

DEGRADED_HEADER = "X-Vision-Degraded"


@dataclass(frozen=True)
class Degraded:
    """What the answer of a request answered without some of its images adds: the report of the
    images not seen, and `notice` (`proxy_vision.degraded_notice`), the text put before the answer.
    The notice is not generated: usage counts the decoder's tokens only.
    """

    report: VisionReport
    notice: str | None = None
    captioner_down: bool = True  # False: only document pages were left out (no captioner failed)

    @property
    def headers(self) -> dict[str, str]:
        return {DEGRADED_HEADER: "captioner-unavailable"} if self.captioner_down else {}


@dataclass(frozen=True)
class DecoderInput:
    """A chat as the decoder gets it: text messages (with image slots under native vision), the
    checked images that the slots name, and what was not seen.
    """

    messages: list[TextMessage]
    images: list[ImageBytes] = field(default_factory=list)
    degraded: Degraded | None = None
    uncaptioned: int = 0  # `prepare_to_count`: images whose captions are left out


class VisionPipeline:
    """What one served model's decoder gets for a request's images and documents (see the module's docstring)."""

    def __init__(
        self,
        captioner: Captioner | None,
        *,
        model_name: str,
        images: ImageInputConfig,
        vision: ProxyVisionConfig | None = None,
        native_max_images: int | None = None,
        documents: DocumentStage | None = None,
        document_fit: ContextFit | None = None,
    ) -> None:
        """`captioner`: None when the model takes no images through a captioner; `images`: the image
        limits and fetching; `vision`: the failure policy and notice; `native_max_images`: set when
        the decoder sees images itself (native vision): the most images one request may carry;
        `documents`: the stage that reads documents into the chat first (None: a request with a
        document is a 400); `document_fit`: the model's context, which documents are fitted to.
        """
        self._documents = documents
        self._document_fit = document_fit
        self._captioner = captioner
        self._model = model_name
        self._images = images
        self._vision = vision or ProxyVisionConfig()
        self._native_images = (
            None
            if native_max_images is None
            else images.model_copy(update={"max_images_per_request": native_max_images})
        )

    async def prepare(self, messages: list[ChatMessage], record: RequestRecord) -> DecoderInput:
        """`record`: gets the images' sizes and fetch times, the caption cache's hits and misses,
        and the reason of a degraded answer.
        """
        expanded = await self._read_documents(messages, record)
        if self._native_images is not None:
            seen = await self._native(expanded.messages, self._native_images, record)
        else:
            seen = await self._proxy(expanded, record)
        return _with_pages(seen, expanded.unseen)

    def _image_limits(self) -> ImageInputConfig | None:
        """The limits a document's page images count against; None when the model takes no images."""
        if self._native_images is not None:
            return self._native_images
        return self._images if self._captioner is not None else None

    async def _read_documents(self, messages: list[ChatMessage], record: RequestRecord) -> Expanded:
        if self._documents is None:
            if count_documents(messages):
                raise VisionDisabledError("This server reads no documents.", param="messages")
            return Expanded(messages)
        caller = Caller(record.key_digest, record.request_id)
        return await self._documents.expand(messages, caller, self._image_limits(), self._document_fit)

    async def prepare_to_count(self, messages: list[ChatMessage], record: RequestRecord) -> DecoderInput:
        """/tokenize's: as `prepare` under native vision (the images go to the decoder, which counts
        their tokens), but never captioning: under proxy vision each image's ``Image N:`` line is
        written without its caption (not known until captioned, and a count must not cost the
        captioner a call) and `uncaptioned` says how many were left out. A model without vision: a
        400, as for a chat.
        """
        expanded = await self._read_documents(messages, record)
        messages = expanded.messages
        if self._native_images is not None:
            return _with_pages(await self._native(messages, self._native_images, record), expanded.unseen)
        images = count_images(messages)
        if images and self._captioner is None:
            raise VisionDisabledError(
                f"Model {self._model!r} does not accept images (vision is disabled).", param="messages"
            )
        if images:
            check_image_counts(messages, self._images)
        seen = DecoderInput(as_text(messages), uncaptioned=images)
        return _with_pages(seen, expanded.unseen)

    async def _proxy(self, expanded: Expanded, record: RequestRecord) -> DecoderInput:
        """Captions in place of images; with the policy ``degrade``, a marker in place of each image
        the captioner could not describe, and what the answer must say about them (a document's
        page, by its document and number; an image the user sent, by its index among them).
        """
        messages = expanded.messages
        if not count_images(messages):
            return DecoderInput(rewrite(messages, []))
        if self._captioner is None:
            raise VisionDisabledError(
                f"Model {self._model!r} does not accept images (vision is disabled).", param="messages"
            )
        images = await collect_images(messages, self._images, record.images)
        cache = CacheStats()
        try:
            captions = await self._captioner.caption(images, cache)
        except CaptionerUnavailable as exc:
            if self._vision.on_failure == "reject":
                raise
            logger.warning("answering without image descriptions: %s", exc.message)
            reason: UnseenReason = "captioner_timeout" if isinstance(exc, CaptionerTimeout) else "captioner_unavailable"
            record.degraded = reason
            pages = [expanded.page_images.get(id(part)) for _, _, part in parts_of(messages, ImagePart)]
            users = [k for k, page in enumerate(pages) if page is None]
            unseen = [UnseenImage(index=n, reason=reason, message=exc.message) for n in range(len(users))]
            unseen_pages = [page.unseen(reason) for page in pages if page is not None]
            report = VisionReport(unseen_images=unseen, unseen_pages=unseen_pages)
            degraded = Degraded(report, self._vision.degraded_notice)
            markers = [unseen_marker(reason) if page is None else unseen_page_marker(reason) for page in pages]
            return DecoderInput(rewrite(messages, markers), degraded=degraded)
        finally:
            record.cache_hits, record.cache_misses = cache.hits, cache.misses
        return DecoderInput(rewrite(messages, captions))

    @staticmethod
    async def _native(messages: list[ChatMessage], limits: ImageInputConfig, record: RequestRecord) -> DecoderInput:
        """The images, fetched and checked as in proxy mode (within the model's own per-request
        limit), and the chat with each image's slot where it was.
        """
        if not count_images(messages):
            return DecoderInput(native_messages(messages))
        images = await collect_images(messages, limits, record.images)
        return DecoderInput(
            native_messages(messages), [ImageBytes(data=image.data, sha256=image.digest) for image in images]
        )


def _with_pages(seen: DecoderInput, unseen: list[UnseenPage]) -> DecoderInput:
    """`seen` with the document pages the stage left out added to its report (a report of its own
    when every image was seen: no captioner failed, so no degraded header and no notice).
    """
    if not unseen:
        return seen
    if seen.degraded is None:
        degraded = Degraded(VisionReport(unseen_pages=unseen), captioner_down=False)
    else:
        report = seen.degraded.report
        pages = [*unseen, *report.unseen_pages]
        pages.sort(key=lambda page: (page.document, page.page))
        degraded = Degraded(report.model_copy(update={"unseen_pages": pages}), seen.degraded.notice)
    return DecoderInput(seen.messages, seen.images, degraded, seen.uncaptioned)

"""The chat completions endpoint's request logic, apart from its route (as vLLM keeps
`serving_chat` apart from its `api_router`): a plain class that takes the decoder's handle and the
captioner client, so that it runs, and is tested, without Ray and without HTTP.

One request (routed here by its `model`, `served.ServedModels`): with images, the captioner
describes them and the chat is rewritten to text (proxy vision), or the images, checked here, go
to the decoder itself with their places in the chat (native vision, up to the model's own image
limit); when the captioner is down, the request is a 503 (``reject``) or is answered without them
(``degrade``): the decoder is told that the images were not seen, and the response says which and
why (`vision` field, `system_fingerprint`, `X-Vision-Degraded` header, and
`proxy_vision.degraded_notice` before the text when set). The decoder's first chunk is awaited
before anything is sent, so errors before the first byte keep their status. Everything runs before
one deadline (`server.request_timeout_s`): a 408 before the first byte, an error event after; the
generation is cancelled either way.
"""

from __future__ import annotations

import asyncio
import json
import logging

from deployments.config import ImageInputConfig, ProxyVisionConfig
from deployments.errors import (
    CaptionerTimeout,
    CaptionerUnavailable,
    RequestTimeoutError,
    VisionDisabledError,
)
from deployments.ingress.generation import Reply, sampling_fields, timed_out
from deployments.ingress.ports import Captioner, DecoderHandle
from deployments.ingress.sse import ChatChoices, Degraded, completion, sse_events
from deployments.ingress.stream import DecoderStream
from deployments.ingress.vision.cache import CacheStats
from deployments.ingress.vision.collect import collect_images, count_images
from deployments.ingress.vision.native import native_messages
from deployments.ingress.vision.rewrite import rewrite, unseen_marker
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.chat import (
    ChatCompletionRequest,
    ChatMessage,
    JsonObjectFormat,
    JsonSchemaResponseFormat,
    NamedToolChoice,
)
from deployments.protocol.openai.common import UnseenImage, UnseenReason, VisionReport
from deployments.protocol.replica import GenerateRequest, GrammarSpec, ImageBytes, TextMessage
from deployments.tools.plan import ToolPlan, plan_tools

logger = logging.getLogger("ray.serve")

DEGRADED_HEADER = "X-Vision-Degraded"


def tool_plan(body: ChatCompletionRequest) -> ToolPlan:
    """The plan of the request's `tools`, `tool_choice` and `parallel_tool_calls`."""
    choice = body.tool_choice
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    formatted = body.response_format is not None and body.response_format.type != "text"
    return plan_tools(
        [tool.function for tool in body.tools or []],
        None if isinstance(choice, NamedToolChoice) else choice,
        function=named,
        parallel=body.parallel_tool_calls,
        constrained_by="response_format" if formatted else None,
    )


def response_grammar(body: ChatCompletionRequest, plan: ToolPlan) -> GrammarSpec | None:
    """The grammar of `response_format` (json_object, json_schema), or that of the tool plan."""
    fmt = body.response_format
    if isinstance(fmt, JsonObjectFormat):
        return GrammarSpec(kind="json_object")
    if isinstance(fmt, JsonSchemaResponseFormat):
        return GrammarSpec(kind="json_schema", json_schema=json.dumps(fmt.json_schema.schema_))
    return plan.grammar


def generate_request(
    body: ChatCompletionRequest,
    messages: list[TextMessage],
    plan: ToolPlan,
    max_n: int = 1,
    images: list[ImageBytes] | None = None,
) -> GenerateRequest:
    """What the decoder gets: the chat (text only, or with image slots and `images` for a native VLM),
    the tools its template renders, and the request's own generation settings (a grammar for
    `response_format` or a forced tool call)."""
    return GenerateRequest(
        messages=messages,
        images=images or [],
        tools=plan.tools,
        max_tokens=body.completion_limit,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
        grammar=response_grammar(body, plan),
        **sampling_fields(body, max_n),
    )


class ChatService:
    def __init__(
        self,
        decoder: DecoderHandle,
        captioner: Captioner | None,
        *,
        model_name: str,
        request_timeout_s: float,
        images: ImageInputConfig,
        vision: ProxyVisionConfig | None = None,
        max_n: int = 8,
        native_max_images: int | None = None,
    ) -> None:
        """`decoder`: a handle to the decoder deployment (or a fake with the same calls);
        `captioner`: None when the model takes no images through a captioner; `vision`: the failure
        policy and notice; `max_n`: the most choices a request may ask for; `native_max_images`: set
        when the decoder sees images itself (native vision): the most images one request may carry."""
        self._decoder = decoder
        self._captioner = captioner
        self._model = model_name
        self._timeout_s = request_timeout_s
        self._images = images
        self._vision = vision or ProxyVisionConfig()
        self._max_n = max_n
        self._native_images = (
            None
            if native_max_images is None
            else images.model_copy(update={"max_images_per_request": native_max_images})
        )

    async def create(self, body: ChatCompletionRequest, record: RequestRecord) -> Reply:
        """`record`: what this request's access-log line and metrics say, filled in as it goes."""
        plan = tool_plan(body)
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        timeout = asyncio.timeout_at(deadline)
        images: list[ImageBytes] = []
        degraded: Degraded | None = None
        try:
            async with timeout:
                if self._native_images is not None:
                    messages, images = await self._native_messages(body.messages, self._native_images, record)
                else:
                    messages, degraded = await self._text_messages(body.messages, record)
        except TimeoutError:
            if timeout.expired():
                raise self._timed_out() from None
            raise
        request = generate_request(body, messages, plan, self._max_n, images)
        chunks = self._decoder.options(stream=True).generate.remote(request)
        stream = DecoderStream(chunks, deadline, self._timed_out, record)
        first = await stream.next()  # errors before the first byte keep their status
        headers = {DEGRADED_HEADER: "captioner-unavailable"} if degraded else {}
        cid = f"chatcmpl-{record.request_id}"
        choices = ChatChoices(body.n, plan, body.logprobs, degraded.notice if degraded else None)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            events = sse_events(
                first, stream, cid, self._model, choices, degraded, include_usage=include_usage, record=record
            )
            return Reply(headers, events=events)
        return Reply(headers, body=await completion(first, stream, cid, self._model, choices, degraded))

    async def _text_messages(
        self, messages: list[ChatMessage], record: RequestRecord
    ) -> tuple[list[TextMessage], Degraded | None]:
        """Proxy vision: captions in place of images; with the policy ``degrade``, a marker in place of
        each image the captioner could not describe, and what the response must say about them."""
        if not count_images(messages):
            return rewrite(messages, []), None
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
            unseen = [UnseenImage(index=i, reason=reason, message=exc.message) for i in range(len(images))]
            degraded = Degraded(VisionReport(unseen_images=unseen), self._vision.degraded_notice)
            return rewrite(messages, [unseen_marker(reason)] * len(images)), degraded
        finally:
            record.cache_hits, record.cache_misses = cache.hits, cache.misses
        return rewrite(messages, captions), None

    @staticmethod
    async def _native_messages(
        messages: list[ChatMessage], limits: ImageInputConfig, record: RequestRecord
    ) -> tuple[list[TextMessage], list[ImageBytes]]:
        """Native vision: the images, fetched and checked as in proxy mode (within the model's own
        per-request limit), and the chat with each image's slot where it was."""
        if not count_images(messages):
            return native_messages(messages), []
        images = await collect_images(messages, limits, record.images)
        return native_messages(messages), [ImageBytes(data=image.data, sha256=image.digest) for image in images]

    def _timed_out(self) -> RequestTimeoutError:
        return timed_out(self._timeout_s)

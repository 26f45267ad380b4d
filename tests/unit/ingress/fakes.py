"""Fakes of what the ingress's request logic calls through Serve: the decoder's handle (its
streaming `generate`, its `status`, `tokenize` and `detokenize`) and the captioner client. No Ray
is started. They satisfy the Protocols `deployments.ingress.handles.DecoderHandle` and
`deployments.ingress.vision.client.Captioner`; `answer_core` builds a served model's answer core
over them, as the Ingress does over the real ones."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from deployments.config import ImageInputConfig, ProxyVisionConfig
from deployments.errors import CaptionerUnavailable, InvalidRequestError
from deployments.ingress.answer.core import AnswerCore
from deployments.ingress.documents.stage import DocumentStage
from deployments.ingress.media.cache import CacheStats
from deployments.ingress.vision.cache import CaptionCache
from deployments.ingress.vision.collect import ImageInput
from deployments.ingress.vision.pipeline import VisionPipeline
from deployments.protocol.openai.common import TokenLogprob, TopLogprob
from deployments.protocol.replica import ComponentStatus, GenerateChunk, GenerateRequest, TokenizedPrompt, TokenizeInput


class FakeStream:
    """A streaming call's answer: `pieces` as chunks, each after `delay_s`, then the final chunk, for
    each of the request's `n` sequences in turn (sequence i's text starts with "i:" when n > 1); with
    `logprobs`, one fake entry per piece (logprob -0.1 * position, alternatives sorted). `error` is
    raised in place of the chunk numbered `fail_at`. The final chunks say `truncated` prompt tokens
    were dropped to fit the context and `cached` came from a prefix cache; the first chunk of a
    request with tools names `tool_format`."""

    def __init__(
        self,
        pieces: list[str],
        delay_s: float,
        error: BaseException | None,
        fail_at: int,
        request: GenerateRequest,
        truncated: int = 0,
        tool_format: str | None = None,
        cached: int | None = None,
    ) -> None:
        self._chunks: list[GenerateChunk] = []
        for index in range(request.n):
            texts = [f"{index}:" + pieces[0], *pieces[1:]] if request.n > 1 and pieces else list(pieces)
            for position, text in enumerate(texts):
                logprobs = None if request.logprobs is None else [fake_logprob(text, position, request.logprobs)]
                told = tool_format if request.tools and position == 0 else None
                chunk = GenerateChunk(
                    index=index,
                    text=text,
                    logprobs=logprobs,
                    tool_format=told,
                    prompt_tokens=3,
                    completion_tokens=position + 1,  # totals so far, as the decoder sends them
                )
                self._chunks.append(chunk)
            final = GenerateChunk(
                index=index,
                finish_reason="stop",
                prompt_tokens=3,
                completion_tokens=len(texts),
                truncated_prompt_tokens=truncated,
                cached_prompt_tokens=cached,
            )
            self._chunks.append(final)
        self._delay_s, self._error, self._fail_at = delay_s, error, fail_at
        self.sent = 0
        self.cancelled = False

    def __anext__(self) -> Any:
        return self._next()

    async def _next(self) -> GenerateChunk:
        await asyncio.sleep(self._delay_s)
        if self._error is not None and self.sent == self._fail_at:
            raise self._error
        if self.sent == len(self._chunks):
            raise StopAsyncIteration
        self.sent += 1
        return self._chunks[self.sent - 1]

    def cancel(self) -> None:
        self.cancelled = True


def fake_logprob(text: str, position: int, top: int) -> TokenLogprob:
    alternatives = [TopLogprob(token=text, bytes=list(text.encode()), logprob=-0.1 * position)]
    alternatives += [TopLogprob(token=f"alt{k}", bytes=list(f"alt{k}".encode()), logprob=-1.0 - k) for k in range(top)]
    return TokenLogprob(token=text, bytes=list(text.encode()), logprob=-0.1 * position, top_logprobs=alternatives[:top])


FAKE_VOCABULARY = 100  # the fake decoder's token ids: 0 to 99


class FakeDecoder:
    """`options(stream=True).generate.remote(request)`, `status.remote()`, `tokenize.remote(request)`
    and `detokenize.remote(tokens)`, as on a handle. Its tokens are a prompt's characters (their code
    points modulo `FAKE_VOCABULARY`: a chat's messages' contents joined, each image slot one
    `image_tokens`-long run of 0s), and `detokenize` writes each id as ``<id>``."""

    app_name, deployment_name = "default", "PrimaryDecoder"

    def __init__(
        self, pieces: Sequence[str] = ("Hello", " there"), delay_s: float = 0.0, error: BaseException | None = None
    ) -> None:
        self.pieces, self.delay_s, self.error = list(pieces), delay_s, error
        self.fail_at = 0
        self.down = False  # `status()` says not ready
        self.truncated = 0  # prompt tokens the final chunks say were dropped to fit the context
        self.tool_format: str | None = None  # what the first chunk of a request with tools says
        self.cached: int | None = None  # prompt tokens the final chunks say came from the prefix cache
        self.requests: list[GenerateRequest] = []
        self.session_ids: list[str] = []
        self.tokenized: list[TokenizeInput] = []
        self.image_tokens = 5  # tokens of each image a native request sends
        self.streams: list[FakeStream] = []
        self.generate = SimpleNamespace(remote=self._generate)
        self.status = SimpleNamespace(remote=self._status)
        self.tokenize = SimpleNamespace(remote=self._tokenize)
        self.detokenize = SimpleNamespace(remote=self._detokenize)

    def options(self, *, stream: bool, session_id: str = "") -> FakeDecoder:
        assert stream
        self.session_ids.append(session_id)  # the client's session hint, for the decoders' router
        return self

    def _generate(self, request: GenerateRequest) -> FakeStream:
        self.requests.append(request)
        self.streams.append(
            FakeStream(
                self.pieces,
                self.delay_s,
                self.error,
                self.fail_at,
                request,
                self.truncated,
                self.tool_format,
                self.cached,
            )
        )
        return self.streams[-1]

    async def _tokenize(self, request: TokenizeInput) -> TokenizedPrompt:
        self.tokenized.append(request)
        text = request.prompt if request.prompt is not None else "".join(m.content for m in request.messages)
        images = [0] * self.image_tokens * len(request.images)
        ids = [ord(c) % FAKE_VOCABULARY for c in text] + images
        strs = list(text) + ["<image>"] * len(images) if request.return_token_strs else None
        image_tokens = len(images)
        return TokenizedPrompt(
            tokens=ids, count=len(ids), max_model_len=2048, image_tokens=image_tokens, token_strs=strs
        )

    async def _detokenize(self, tokens: list[int]) -> str:
        if bad := [t for t in tokens if t >= FAKE_VOCABULARY]:
            raise InvalidRequestError(f"Token ids outside the vocabulary: {bad[:5]}", param="tokens")
        return "".join(f"<{t}>" for t in tokens)

    async def _status(self) -> ComponentStatus:
        if self.down:
            return ComponentStatus(ready=False, reason="engine failed to load")
        return ComponentStatus(ready=True, model="echo")


class FakeCaptioner:
    """Captions each image by its message's text, through a real caption cache as the real client does
    (`calls` are the images that missed it); or is down (raises `error`, a `CaptionerUnavailable`, and
    is not ready on `status()`)."""

    def __init__(
        self, down: bool = False, delay_s: float = 0.0, error: type[CaptionerUnavailable] = CaptionerUnavailable
    ) -> None:
        self.down, self.delay_s, self.error = down, delay_s, error
        self.calls: list[list[ImageInput]] = []
        self.cache = CaptionCache(max_entries=16, max_bytes=2**20)

    async def status(self) -> ComponentStatus:
        if self.down:
            return ComponentStatus(ready=False, reason="replica died")
        return ComponentStatus(ready=True, model="cap")

    async def caption(self, images: list[ImageInput], stats: CacheStats | None = None) -> list[str]:
        async def missing(indices: list[int]) -> list[str]:
            self.calls.append([images[i] for i in indices])
            await asyncio.sleep(self.delay_s)
            if self.down:
                raise self.error("The vision captioner is unavailable: replica died")
            return [f"a picture for {images[i].user_text!r}" for i in indices]

        keys = [f"{image.digest}:{image.user_text}" for image in images]
        return await self.cache.get_or_compute(keys, missing, stats)


def answer_core(
    decoder: FakeDecoder,
    captioner: FakeCaptioner | None = None,
    *,
    model_name: str = "echo",
    request_timeout_s: float = 5.0,
    images: ImageInputConfig | None = None,
    vision: ProxyVisionConfig | None = None,
    max_n: int = 8,
    native_max_images: int | None = None,
    documents: DocumentStage | None = None,
) -> AnswerCore:
    """A served model's answer core over fakes, with its vision pipeline (and document stage)."""
    pipeline = VisionPipeline(
        captioner,
        model_name=model_name,
        images=images or ImageInputConfig(),
        vision=vision,
        native_max_images=native_max_images,
        documents=documents,
    )
    return AnswerCore(decoder, pipeline, model_name=model_name, request_timeout_s=request_timeout_s, max_n=max_n)

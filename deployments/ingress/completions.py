"""The legacy `/v1/completions` endpoint's request logic: a prompt used as it is (text or token
ids, no chat template), with the same decoder, limits, deadline and errors as chat.

A list of prompts is one decoder call per prompt, run together; choice `i * n + j` is prompt i's
j-th sequence, as OpenAI numbers them. `echo` puts the prompt before each choice's text (a text
prompt only: the ingress has no tokenizer). `logprobs` is OpenAI's legacy shape: parallel lists of
tokens, their logprobs, the top alternatives as a dict, and each token's offset in the text.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

from deployments.errors import InvalidRequestError, RequestTimeoutError
from deployments.ingress.generation import Reply, sampling_fields, timed_out
from deployments.ingress.ports import DecoderHandle
from deployments.ingress.sse import framed
from deployments.ingress.stream import DecoderStream
from deployments.merge import MergedStreams
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.common import FinishReason, TokenLogprob, Usage
from deployments.protocol.openai.completions import Completion, CompletionChoice, CompletionLogprobs, CompletionRequest
from deployments.protocol.replica import GenerateChunk, GenerateRequest


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    offset: int = 0  # characters of text so far (text_offset of the next token)
    finish: FinishReason | None = None
    prompt_tokens: int = 0
    cached_prompt_tokens: int | None = None
    completion_tokens: int = 0


def _legacy_logprobs(tokens: list[TokenLogprob], offset: int) -> CompletionLogprobs:
    out = CompletionLogprobs()
    for token in tokens:
        out.tokens.append(token.token)
        out.token_logprobs.append(token.logprob)
        out.top_logprobs.append({alt.token: alt.logprob for alt in token.top_logprobs})
        out.text_offset.append(offset)
        offset += len(token.token)
    return out


async def _choices(i: int, stream: DecoderStream, n: int) -> AsyncGenerator[GenerateChunk, None]:
    """Prompt i's chunks until its n sequences end, with choice indices made global (`i * n + j`);
    closed early, its generation is cancelled."""
    finished = 0
    try:
        while finished < n:
            chunk = await stream.next()
            finished += chunk.finish_reason is not None
            chunk.index += i * n
            yield chunk
    finally:
        if finished < n:
            stream.cancel()


class CompletionService:
    def __init__(self, decoder: DecoderHandle, *, model_name: str, request_timeout_s: float, max_n: int = 8) -> None:
        self._decoder = decoder
        self._model = model_name
        self._timeout_s = request_timeout_s
        self._max_n = max_n

    async def create(self, body: CompletionRequest, record: RequestRecord) -> Reply:
        prompts = body.prompts
        if body.echo and not all(isinstance(p, str) for p in prompts):
            raise InvalidRequestError("echo needs a text prompt (token ids cannot be echoed here).", param="echo")
        settings = sampling_fields(body, self._max_n)
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        streams = [
            DecoderStream(
                self._decoder.options(stream=True).generate.remote(
                    GenerateRequest(prompt=prompt, max_tokens=body.max_tokens, logprobs=body.logprobs, **settings)
                ),
                deadline,
                self._timed_out,
                record,
            )
            for prompt in prompts
        ]
        merged = MergedStreams([_choices(i, stream, body.n) for i, stream in enumerate(streams)])
        try:
            first = await anext(merged)  # errors before the first byte keep their status
        except BaseException:
            merged.cancel()
            raise
        echoes = [p if body.echo and isinstance(p, str) else "" for p in prompts for _ in range(body.n)]
        writer = _Writer(f"cmpl-{record.request_id}", self._model, echoes, body.n, body.logprobs is not None)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return Reply(events=writer.events(first, merged, include_usage, record))
        return Reply(body=await writer.whole(first, merged))

    def _timed_out(self) -> RequestTimeoutError:
        return timed_out(self._timeout_s)


class _Writer:
    """A completion's choices from the merged chunks: whole, or as server-sent events."""

    def __init__(self, cid: str, model: str, echoes: list[str], n: int, logprobs: bool) -> None:
        """`echoes`: per choice, the text before its output; `n`: choices per prompt."""
        self.cid, self.model, self.created = cid, model, int(time.time())
        self._echoes, self._n = echoes, n
        self._logprobs = logprobs
        self._choices = [_Choice() for _ in echoes]

    def _piece(self, chunk: GenerateChunk) -> CompletionChoice:
        """The choice's text and logprobs in this chunk (the echo before its first text)."""
        choice = self._choices[chunk.index]
        text, start = chunk.text, choice.offset  # start: where this chunk's tokens begin in the text
        if not choice.text and self._echoes[chunk.index]:
            text = self._echoes[chunk.index] + text
            start = len(self._echoes[chunk.index])
        logprobs = _legacy_logprobs(chunk.logprobs or [], start) if self._logprobs else None
        choice.text.append(text)
        choice.offset += len(text)
        if chunk.finish_reason is not None:
            choice.finish = chunk.finish_reason
            choice.prompt_tokens, choice.completion_tokens = chunk.prompt_tokens, chunk.completion_tokens
            choice.cached_prompt_tokens = chunk.cached_prompt_tokens
        return CompletionChoice(index=chunk.index, text=text, logprobs=logprobs, finish_reason=chunk.finish_reason)

    @property
    def _finished(self) -> bool:
        return all(choice.finish is not None for choice in self._choices)

    def _usage(self) -> Usage:
        """Each prompt once (its n choices share it), every completion added up."""
        firsts = self._choices[:: self._n]
        completion = sum(c.completion_tokens for c in self._choices)
        cached = [c.cached_prompt_tokens for c in firsts if c.cached_prompt_tokens is not None]
        return Usage.counted(sum(c.prompt_tokens for c in firsts), completion, cached=sum(cached) if cached else None)

    async def whole(self, first: GenerateChunk, merged: MergedStreams[GenerateChunk]) -> dict:
        pieces: dict[int, list[CompletionChoice]] = {}
        chunk = first
        while True:
            pieces.setdefault(chunk.index, []).append(self._piece(chunk))
            if self._finished:
                break
            chunk = await anext(merged)
        choices = []
        for index in range(len(self._choices)):
            parts = pieces[index]
            logprobs = None
            if self._logprobs:
                logprobs = CompletionLogprobs()
                for part in parts:
                    assert part.logprobs is not None
                    for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                        getattr(logprobs, name).extend(getattr(part.logprobs, name))
            text = "".join(part.text for part in parts)
            choices.append(
                CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=self._choices[index].finish)
            )
        return Completion(
            id=self.cid, created=self.created, model=self.model, choices=choices, usage=self._usage()
        ).model_dump()

    def events(
        self, first: GenerateChunk, merged: MergedStreams[GenerateChunk], include_usage: bool, record: RequestRecord
    ) -> AsyncIterator[str]:
        async def events() -> AsyncIterator[str]:
            chunk = first
            while True:
                yield self._event([self._piece(chunk)])
                if self._finished:
                    if include_usage:
                        yield self._event([], usage=self._usage())
                    return
                chunk = await anext(merged)

        return framed(events(), record, merged.cancel)

    def _event(self, choices: list[CompletionChoice], usage: Usage | None = None) -> str:
        chunk = Completion(id=self.cid, created=self.created, model=self.model, choices=choices, usage=usage)
        return f"data: {json.dumps(chunk.model_dump())}\n\n"

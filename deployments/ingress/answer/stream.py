"""The decoder's chunks for one answer: each awaited before the request's deadline (`DecoderStream`),
and an answer's decoder calls read as one (`Generation`: one call, or one per prompt of a legacy
completion, their choices numbered across them, `i * n + j` for call i's j-th sequence), whose token
counts add up in the request's record (`TokenCounts`: every prompt and every sequence, since the
limits settle and the key's metrics count what the record says).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Protocol

from deployments.errors import DecoderUnavailable, from_serve
from deployments.merge import MergedStreams
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.replica import GenerateChunk


class ChunkStream(Protocol):
    """What a streaming call through a handle gives (Serve's `DeploymentResponseGenerator`)."""

    def __anext__(self) -> Any: ...

    def cancel(self) -> None: ...


class TokenCounts:
    """An answer's token counts so far, written to the request's `record` as they come: each decoder
    call's prompt once (a legacy completion's prompts are one call each), and each sequence's
    completion (every chunk carries its sequence's totals), also when the answer ends before its
    sequences do.
    """

    def __init__(self, record: RequestRecord) -> None:
        self._record = record
        self._prompt: dict[int, int] = {}  # per call
        self._truncated: dict[int, int] = {}  # per call, at its latest sequence's end
        self._completion: dict[tuple[int, int], int] = {}  # per (call, sequence)
        self._prompt_sum = self._completion_sum = 0

    def count(self, call: int, chunk: GenerateChunk) -> None:
        """Call `call`'s `chunk` (its index is the call's own sequence's)."""
        record = self._record
        if chunk.prompt_tokens:
            self._prompt_sum += chunk.prompt_tokens - self._prompt.get(call, 0)
            self._prompt[call] = chunk.prompt_tokens
            record.prompt_tokens = self._prompt_sum
        if chunk.completion_tokens or chunk.finish_reason is not None:
            sequence = (call, chunk.index)
            self._completion_sum += chunk.completion_tokens - self._completion.get(sequence, 0)
            self._completion[sequence] = chunk.completion_tokens
            record.completion_tokens = self._completion_sum
        if chunk.finish_reason is not None:  # the end of one of the call's sequences
            self._truncated[call] = chunk.truncated_prompt_tokens
            record.truncated_prompt_tokens = sum(self._truncated.values()) or None


class DecoderStream:
    """`next()` is the decoder's next chunk; past the deadline the generation is cancelled and
    `timed_out()` raised. Serve's errors (a full queue, a dead replica) become ours. The request's
    `record` gets the time of the first chunk, and `counts` (the answer's, shared by its calls; the
    record's own by default) this call's token counts as `call`.
    """

    def __init__(
        self,
        chunks: ChunkStream,
        deadline: float,
        timed_out: Callable[[], Exception],
        record: RequestRecord | None = None,
        counts: TokenCounts | None = None,
        call: int = 0,
    ) -> None:
        self._chunks = chunks
        self._deadline = deadline
        self._timed_out = timed_out
        self._record = record or RequestRecord()
        self._counts = counts or TokenCounts(self._record)
        self._call = call

    async def next(self) -> GenerateChunk:
        timeout = asyncio.timeout_at(self._deadline)
        try:
            async with timeout:
                chunk: GenerateChunk = await self._chunks.__anext__()
        except StopAsyncIteration:
            raise DecoderUnavailable("The decoder ended the stream without a final chunk.") from None
        except TimeoutError:
            if not timeout.expired():
                raise
            self._chunks.cancel()
            raise self._timed_out() from None
        except Exception as exc:  # a full queue, a dead replica: ours to name
            raise from_serve(exc) from None
        self._record.first_token()
        if chunk.queued_s is not None and self._record.queued_s is None:
            self._record.queued_s = chunk.queued_s
        self._counts.count(self._call, chunk)
        return chunk

    def cancel(self) -> None:
        """Free the decoder's slot now (the client went away)."""
        self._chunks.cancel()


async def _choices(i: int, stream: DecoderStream, n: int) -> AsyncGenerator[GenerateChunk, None]:
    """Call i's chunks until its n sequences end, with choice indices made global (`i * n + j`);
    closed early, its generation is cancelled.
    """
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


class Generation:
    """An answer's chunks: `first`, awaited before anything is sent (so that errors before the first
    byte keep their status), then `next()`; `cancel()` frees the decoder's slots at once.
    """

    def __init__(
        self, first: GenerateChunk, read: Callable[[], Awaitable[GenerateChunk]], cancel: Callable[[], None]
    ) -> None:
        self.first = first
        self.next = read
        self.cancel = cancel

    @classmethod
    async def start(cls, streams: list[DecoderStream], n: int) -> Generation:
        """The answer of `streams`, one per decoder call, each of `n` sequences."""
        if len(streams) == 1:
            stream = streams[0]
            return cls(await stream.next(), stream.next, stream.cancel)
        merged = MergedStreams([_choices(i, stream, n) for i, stream in enumerate(streams)])
        try:
            first = await anext(merged)
        except BaseException:
            merged.cancel()
            raise
        return cls(first, merged.__anext__, merged.cancel)

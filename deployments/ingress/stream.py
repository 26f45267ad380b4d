"""The decoder's chunks for one request, each awaited before the request's deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from deployments.errors import DecoderUnavailable, from_serve
from deployments.protocol import GenerateChunk


class ChunkStream(Protocol):
    """What a streaming call through a handle gives (Serve's `DeploymentResponseGenerator`)."""

    def __anext__(self) -> Any: ...

    def cancel(self) -> None: ...


class DecoderStream:
    """`next()` is the decoder's next chunk; past the deadline the generation is cancelled and
    `timed_out()` raised. Serve's errors (a full queue, a dead replica) become ours."""

    def __init__(self, chunks: ChunkStream, deadline: float, timed_out: Callable[[], Exception]) -> None:
        self._chunks = chunks
        self._deadline = deadline
        self._timed_out = timed_out

    async def next(self) -> GenerateChunk:
        timeout = asyncio.timeout_at(self._deadline)
        try:
            async with timeout:
                return await self._chunks.__anext__()
        except StopAsyncIteration:
            raise DecoderUnavailable("The decoder ended the stream without a final chunk.") from None
        except TimeoutError:
            if not timeout.expired():
                raise
            self._chunks.cancel()
            raise self._timed_out() from None
        except Exception as exc:  # a full queue, a dead replica: ours to name
            raise from_serve(exc) from None

    def cancel(self) -> None:
        """Free the decoder's slot now (the client went away)."""
        self._chunks.cancel()

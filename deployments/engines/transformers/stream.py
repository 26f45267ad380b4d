"""The one loop from generated token ids to `EngineOutput` pieces, shared by every transformers
decoder: each engine hands over its sequence's new token ids as they come, this loop detokenizes
them incrementally (never splitting a multi-byte character), attaches the logprobs recorded for
them, and ends with the finish reason and what truncation dropped."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from deployments.engines.base import EngineOutput
from deployments.engines.transformers.constraints import LogprobStream, RequestConstraints, TokenTexts


class IncrementalText:
    """Turns a growing list of token ids into text deltas, holding back incomplete characters."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.ids: list[int] = []
        self._emitted = ""

    def feed(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        return self._delta(final=False)

    def flush(self) -> str:
        """Everything not yet emitted, incomplete characters included (the sequence has ended)."""
        return self._delta(final=True)

    def _delta(self, *, final: bool) -> str:
        text = str(self._tokenizer.decode(self.ids, skip_special_tokens=True))
        if not final and text.endswith("\ufffd"):  # a multi-byte character is still incomplete
            return ""
        delta, self._emitted = text[len(self._emitted) :], text
        return delta


@dataclass
class TokenStream:
    """A sequence on its way: its new token ids as they come (closing `tokens` must stop the sequence
    and free its slot), and what its outputs report."""

    tokens: AsyncIterator[list[int]]
    prompt_tokens: int
    max_tokens: int
    constraints: RequestConstraints | None
    dropped_prompt_tokens: int = 0


async def stream_outputs(
    stream: TokenStream, tokenizer: Any, token_texts: TokenTexts
) -> AsyncGenerator[EngineOutput, None]:
    """`EngineOutput` pieces for `stream`; the last piece has `finish_reason` (``length`` at its
    `max_tokens`, else ``stop``). Closing this generator closes `stream.tokens` at once."""
    text = IncrementalText(tokenizer)
    logprobs = LogprobStream(stream.constraints, token_texts)
    async with contextlib.aclosing(stream.tokens):  # type: ignore[type-var]
        async for ids in stream.tokens:
            if delta := text.feed(ids):
                n = len(text.ids)
                yield EngineOutput(delta, n, stream.prompt_tokens, logprobs=logprobs.take(n))
    n = len(text.ids)
    yield EngineOutput(
        text.flush(),
        n,
        stream.prompt_tokens,
        finish_reason="length" if n >= stream.max_tokens else "stop",
        logprobs=logprobs.take(n),
        truncated_prompt_tokens=stream.dropped_prompt_tokens,
    )

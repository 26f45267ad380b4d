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
    """Turns a growing list of token ids into text deltas, holding back incomplete characters. Special
    tokens are left out, but those in `keep` (the tool-call markers of a request with tools)."""

    def __init__(self, tokenizer: Any, keep: frozenset[int] = frozenset()) -> None:
        self._tokenizer = tokenizer
        self.ids: list[int] = []
        self._emitted = ""
        self._keep = keep
        self._skip: frozenset[int] = frozenset()
        if keep:
            added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
            special = {int(i) for i, t in added.items() if getattr(t, "special", False)}
            self._skip = frozenset(special | set(getattr(tokenizer, "all_special_ids", []))) - keep

    def feed(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        return self._delta(final=False)

    def flush(self) -> str:
        """Everything not yet emitted, incomplete characters included (the sequence has ended)."""
        return self._delta(final=True)

    def _decode(self, ids: list[int]) -> str:
        if self._keep:
            return str(self._tokenizer.decode([i for i in ids if i not in self._skip], skip_special_tokens=False))
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))

    def _delta(self, *, final: bool) -> str:
        text = self._decode(self.ids)
        if not final and text.endswith("\ufffd"):  # a multi-byte character is still incomplete
            return ""
        delta, self._emitted = text[len(self._emitted) :], text
        return delta


class WindowedText(IncrementalText):
    """`IncrementalText` that decodes a window, not the whole sequence, at each token (as TGI and
    vLLM do): the text of the tokens since the previous emission's start, minus the text of those
    already emitted, so a token costs two short decodes however long the answer grows. The window
    starts one emission back, so that a token whose text depends on the one before it (a leading
    space, a multi-byte character split across tokens) decodes as in the whole sequence."""

    def __init__(self, tokenizer: Any, keep: frozenset[int] = frozenset()) -> None:
        super().__init__(tokenizer, keep)
        self._prefix = self._read = 0  # the window's start; the end of the tokens already emitted

    def _delta(self, *, final: bool) -> str:
        emitted = self._decode(self.ids[self._prefix : self._read])
        text = self._decode(self.ids[self._prefix :])
        if final:
            return text[len(emitted) :]
        if len(text) > len(emitted) and not text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return text[len(emitted) :]
        return ""


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
    stream: TokenStream,
    tokenizer: Any,
    token_texts: TokenTexts,
    keep: frozenset[int] = frozenset(),
    text_class: type[IncrementalText] = IncrementalText,
) -> AsyncGenerator[EngineOutput, None]:
    """`EngineOutput` pieces for `stream`; the last piece has `finish_reason` (``length`` at its
    `max_tokens`, else ``stop``); `keep`: special tokens kept in the text; `text_class`: how the
    text is detokenized. Closing this generator closes `stream.tokens` at once."""
    text = text_class(tokenizer, keep)
    logprobs = LogprobStream(stream.constraints, token_texts)
    async with contextlib.aclosing(stream.tokens):  # type: ignore[type-var]
        async for ids in stream.tokens:
            if delta := text.feed(ids):
                n = len(text.ids)
                yield EngineOutput(
                    delta,
                    n,
                    stream.prompt_tokens,
                    logprobs=logprobs.take(n),
                    truncated_prompt_tokens=stream.dropped_prompt_tokens,
                )
    n = len(text.ids)
    yield EngineOutput(
        text.flush(),
        n,
        stream.prompt_tokens,
        finish_reason="length" if n >= stream.max_tokens else "stop",
        logprobs=logprobs.take(n),
        truncated_prompt_tokens=stream.dropped_prompt_tokens,
    )

"""The one loop from generated token ids to `EngineOutput` pieces, shared by every transformers
decoder: each engine hands over its sequence's new token ids as they come, this loop detokenizes
them incrementally (never splitting a multi-byte character), attaches the logprobs recorded for
them, and ends with the finish reason and what truncation dropped. vLLM's token rules are applied
here (`StopTokens`): a `stop_token_ids` token ends the sequence (its stream closed, which frees its
slot), the stop token (or the end of sequence) kept in the text only with
`include_stop_str_in_output`, and special tokens kept with `skip_special_tokens: false`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deployments.engines.base import EngineOutput
from deployments.engines.transformers.constraints import LogprobStream, RequestConstraints, TokenTexts

if TYPE_CHECKING:
    from deployments.protocol.replica import GenerateRequest


class IncrementalText:
    """Turns a growing list of token ids into text deltas, holding back incomplete characters. Special
    tokens are left out, but those in `keep` (the tool-call markers of a request with tools); all are
    kept without `skip_special`.
    """

    def __init__(self, tokenizer: Any, keep: frozenset[int] = frozenset(), skip_special: bool = True) -> None:
        self._tokenizer = tokenizer
        self.ids: list[int] = []
        self._emitted = ""
        self._keep = keep
        self._skip_special = skip_special
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
        if not self._skip_special:
            return str(self._tokenizer.decode(ids, skip_special_tokens=False))
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
    space, a multi-byte character split across tokens) decodes as in the whole sequence.
    """

    def __init__(self, tokenizer: Any, keep: frozenset[int] = frozenset(), skip_special: bool = True) -> None:
        super().__init__(tokenizer, keep, skip_special)
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


@dataclass(frozen=True)
class StopTokens:
    """A request's token rules (vLLM's): `stop_ids` end the sequence; the token that ended it (a stop
    token, or one of `eos_ids`) is in the text only with `include`; `skip_special`: special tokens
    left out of the text.
    """

    stop_ids: frozenset[int] = frozenset()
    eos_ids: frozenset[int] = frozenset()
    include: bool = False
    skip_special: bool = True

    @classmethod
    def of(cls, request: GenerateRequest, eos_ids: list[int]) -> StopTokens:
        return cls(
            frozenset(request.stop_token_ids),
            frozenset(eos_ids),
            request.include_stop_str_in_output,
            request.skip_special_tokens,
        )

    def cut(self, ids: list[int]) -> tuple[list[int], list[int], bool]:
        """`(taken, shown, stopped)`: the ids up to and including the first stop token (all when none),
        those of them that the text shows, and whether a stop token ended the sequence.
        """
        at = next((i for i, t in enumerate(ids) if t in self.stop_ids), None)
        taken = ids if at is None else ids[: at + 1]
        if self.include or (self.skip_special and at is None):
            return taken, taken, at is not None
        ending = self.stop_ids | self.eos_ids
        return taken, [t for t in taken if t not in ending], at is not None


def _no_prefix_cache() -> int | None:
    return None


@dataclass
class TokenStream:
    """A sequence on its way: its new token ids as they come (closing `tokens` must stop the sequence
    and free its slot), and what its outputs report. `cached_prompt_tokens`, asked at each piece: how
    many prompt tokens the engine's prefix cache gave (known by the first tokens), None: no cache.
    """

    tokens: AsyncIterator[list[int]]
    prompt_tokens: int
    max_tokens: int
    constraints: RequestConstraints | None
    dropped_prompt_tokens: int = 0
    cached_prompt_tokens: Callable[[], int | None] = _no_prefix_cache


async def stream_outputs(
    stream: TokenStream,
    tokenizer: Any,
    token_texts: TokenTexts,
    keep: frozenset[int] = frozenset(),
    text_class: type[IncrementalText] = IncrementalText,
    rules: StopTokens = StopTokens(),
) -> AsyncGenerator[EngineOutput, None]:
    """`EngineOutput` pieces for `stream`; the last piece has `finish_reason` (``length`` at its
    `max_tokens`, else ``stop``); `keep`: special tokens kept in the text; `text_class`: how the
    text is detokenized; `rules`: the request's stop tokens and special tokens. Closing this
    generator closes `stream.tokens` at once (so does a stop token).
    """
    text = text_class(tokenizer, keep, rules.skip_special)
    logprobs = LogprobStream(stream.constraints, token_texts)
    n, stopped = 0, False
    async with contextlib.aclosing(stream.tokens):  # type: ignore[type-var]
        async for ids in stream.tokens:
            taken, shown, stopped = rules.cut(ids)
            n += len(taken)
            if delta := text.feed(shown):
                yield EngineOutput(
                    delta,
                    n,
                    stream.prompt_tokens,
                    logprobs=logprobs.take(n),
                    truncated_prompt_tokens=stream.dropped_prompt_tokens,
                    cached_prompt_tokens=stream.cached_prompt_tokens(),
                )
            if stopped:
                break  # closes the sequence's tokens: the engine frees its slot
    yield EngineOutput(
        text.flush(),
        n,
        stream.prompt_tokens,
        finish_reason="length" if n >= stream.max_tokens and not stopped else "stop",
        logprobs=logprobs.take(n),
        truncated_prompt_tokens=stream.dropped_prompt_tokens,
        cached_prompt_tokens=stream.cached_prompt_tokens(),
    )

"""Documents fitted to the model's context: whole pages left out from the end until the chat leaves
room for the answer, counted with the model's own tokenizer.

`documents.max_chars_per_request` alone is one budget for every model: 400,000 characters is about
100,000 tokens, and a 9-page PDF (about 40,000 characters) already overflows an 8,192-token context.
So the budget is the model's: what the context (`max_model_len`) leaves after the rest of the prompt
and the completion's reserve (the model's default `max_tokens`; a request that asks for more gets
the decoder's own 400 with the numbers when even that does not fit).

Counting is the decoder's `tokenize` (its tokenizer and chat template, in a worker thread beside its
slots: no generation waits), so nothing here guesses a tokenizer:

1. The model's context is learned from the first count and kept. A chat whose UTF-8 bytes (plus a
   margin for the template) fit in what the context leaves needs no count at all: a token of a
   byte-level or byte-fallback tokenizer covers at least one byte.
2. Otherwise the chat with its documents is counted, and when it leaves no room, the chat without
   them too, which gives this document's own characters per token (prose, code, tables and other
   scripts differ by more than 2x, so no fixed ratio is right for all).
3. The page text is then cut to that ratio's share of the room (2% under, for the marks) and the
   result counted again; at most `ROUNDS` times, each from the last count.

The first page of the first document is always kept: when even it does not fit, the decoder answers
the 400 `context_length_exceeded` with its numbers. A page image's tokens (native vision) or caption
(proxy vision) are not known here and are not counted. When the decoder cannot count (loading,
stopped), the chat goes on as the character cap made it (the decoder says what it must).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

from deployments.ingress.media.chat import as_text
from deployments.protocol.openai.chat import ChatMessage
from deployments.protocol.replica import TokenizedPrompt, TokenizeInput

if TYPE_CHECKING:
    from deployments.ingress.handles import DecoderHandle

logger = logging.getLogger("ray.serve")

ROUNDS = 3  # counts after the first two; each lands within a few % of the room
_TEMPLATE_TOKENS = 256  # what a chat template may add beyond the text (a default system prompt, roles)
_TOKENS_PER_MESSAGE = 16

Count = Callable[[TokenizeInput], Awaitable[TokenizedPrompt]]


def decoder_count(decoder: DecoderHandle) -> Count:
    """The decoder's `tokenize` as a `Count`."""

    async def count(request: TokenizeInput) -> TokenizedPrompt:
        counted: TokenizedPrompt = await decoder.tokenize.remote(request)
        return counted

    return count


@dataclass
class ContextFit:
    """One served model's context as its documents see it: `count` (the decoder's `tokenize`) and
    `reserve`, the completion tokens to leave (the model's default `max_tokens`).
    """

    count: Count
    reserve: int
    context: int | None = field(default=None, init=False)  # learned from the first count; 0: none (a fake)
    counts: int = field(default=0, init=False)  # decoder counts made, for tests and logs

    async def tokens(self, messages: list[ChatMessage]) -> int:
        """The prompt tokens of `messages` as the model is prompted (page images as empty lines)."""
        self.counts += 1
        counted = await self.count(TokenizeInput(messages=as_text(messages)))
        self.context = counted.max_model_len
        return counted.count

    def surely_fits(self, messages: list[ChatMessage]) -> bool:
        """Whether `messages` fit without counting: the context is known and their bytes are fewer
        than the tokens it leaves (or the model has no context limit: a fake's).
        """
        if self.context is None:
            return False
        if self.context == 0:
            return True
        size = sum(len(m.content.encode()) + _TOKENS_PER_MESSAGE for m in as_text(messages)) + _TEMPLATE_TOKENS
        return size + self.reserve <= self.context


class Composed(Protocol):
    """A chat with its documents' pages in it (`stage.Expanded`): its messages and how many
    characters of page text they hold.
    """

    @property
    def messages(self) -> list[ChatMessage]: ...

    @property
    def document_chars(self) -> int: ...


C = TypeVar("C", bound=Composed)


async def fit_documents(expanded: C, compose: Callable[[int], C], fit: ContextFit, rest: list[ChatMessage]) -> C:
    """`expanded` (its documents within the character cap), or the same chat with fewer whole pages
    (`compose(chars)`: the chat with at most `chars` characters of page text, the first page kept)
    so that the prompt leaves `fit.reserve` tokens of the context; `rest`: the chat without its
    documents.
    """
    if fit.surely_fits(expanded.messages):
        return expanded
    try:
        total = await fit.tokens(expanded.messages)
        room = (fit.context or 0) - fit.reserve
        if not fit.context or total <= room:
            return expanded
        others = await fit.tokens(rest)
        best = expanded
        for _ in range(ROUNDS):
            pages = max(total - others, 1)  # the documents' tokens, marks included
            chars = int(best.document_chars * max(room - others, 0) / pages * 0.98)
            if chars >= best.document_chars:
                chars = best.document_chars - 1
            smaller = compose(max(chars, 0))
            if smaller.document_chars >= best.document_chars:  # only the first page left
                return smaller
            best, total = smaller, await fit.tokens(smaller.messages)
            if total <= room:
                return best
        return best
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # the decoder cannot count now: the character cap stands
        logger.warning("documents not fitted to the context (the decoder could not count): %s", exc)
        return expanded

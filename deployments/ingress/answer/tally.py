"""How each choice of an answer ended, and the usage of them all: the per-choice record that every
endpoint's framing keeps beside its own (text, deltas, tool calls).

A choice ends at its sequence's final chunk, or earlier (`cut_short`: a repeated tool call), with
the token counts its sequence had at that chunk. The usage counts each prompt once, however many
choices share it (a chat's `n` choices share one; a legacy completion's `i * n + j` is prompt i's
j-th), and every choice's completion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from deployments.protocol.openai.common import Usage
from deployments.protocol.replica import GenerateChunk

F = TypeVar("F", bound=str)


@dataclass
class Ending(Generic[F]):
    """One choice's end: its finish reason (None while it runs) and its sequence's token counts."""

    finish: F | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    truncated_prompt_tokens: int = 0
    cached_prompt_tokens: int | None = None  # None: the engine has no prefix cache
    cut_short: bool = False  # ended before its sequence did


class Tally(Generic[F]):
    """The endings of an answer's `choices`, `per_prompt` of them sharing each prompt (all of them
    by default).
    """

    def __init__(self, choices: int, per_prompt: int | None = None) -> None:
        self._endings: list[Ending[F]] = [Ending() for _ in range(choices)]
        self._per_prompt = per_prompt or choices

    @property
    def choices(self) -> int:
        return len(self._endings)

    def __getitem__(self, index: int) -> Ending[F]:
        return self._endings[index]

    def end(self, chunk: GenerateChunk, finish: F, *, cut_short: bool = False) -> None:
        """Choice `chunk.index` ends with `finish`, at `chunk`'s token counts."""
        ending = self._endings[chunk.index]
        ending.finish, ending.cut_short = finish, cut_short
        ending.prompt_tokens, ending.completion_tokens = chunk.prompt_tokens, chunk.completion_tokens
        ending.truncated_prompt_tokens = chunk.truncated_prompt_tokens
        ending.cached_prompt_tokens = chunk.cached_prompt_tokens

    @property
    def finished(self) -> bool:
        return all(ending.finish is not None for ending in self._endings)

    @property
    def cut_short(self) -> bool:
        """Some choice ended before its sequence did: once every choice has finished, the generation
        still running is cancelled.
        """
        return any(ending.cut_short for ending in self._endings)

    def usage(self) -> Usage:
        """Each prompt once (the cached and truncated tokens of its first choice), every completion
        added up; `truncated_prompt_tokens` only when a chat was truncated to fit the context.
        """
        firsts = self._endings[:: self._per_prompt]
        cached = [ending.cached_prompt_tokens for ending in firsts if ending.cached_prompt_tokens is not None]
        return Usage.counted(
            sum(ending.prompt_tokens for ending in firsts),
            sum(ending.completion_tokens for ending in self._endings),
            sum(ending.truncated_prompt_tokens for ending in firsts) or None,
            sum(cached) if cached else None,
        )

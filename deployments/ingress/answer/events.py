"""One answer as semantic events, the same for every API (`Answer`): each API only formats them
(chat chunks, completion chunks, Responses events, Anthropic events, and their whole bodies).

Fed the decoder's chunks one by one, `Answer.feed` says what each chunk meant for its choice:
`Began` (the choice's first chunk, with the degraded-vision notice to put before its text),
`Logprobs` (the chunk's tokens' logprobs), `Text` (a run of the answer's text), `Call` (a tool
call's start, `delta.id` set with its name, or a fragment of its arguments), and `Ended` (its
finish). The text is split into content and tool calls by `tools.calls.ToolCallText`, in the
tool-call format the decoder names; an answer without a tool plan (a legacy completion) is its
text as it comes, one `Text` a chunk.

A choice ends at its sequence's final chunk (`stop` or `length`; `tool_calls` when it called tools
and the last call is whole), or earlier when it repeats a tool call (`tool_calls`, `cut_short`: the
rest of its sequence is not the answer's, and the generation is cancelled once every choice has
ended). `tally` holds each ending's token counts and the usage of them all.
"""

from __future__ import annotations

from dataclasses import dataclass

from deployments.ingress.answer.tally import Tally
from deployments.protocol.openai.chat import ChoiceFinish, ToolCallDelta
from deployments.protocol.openai.common import TokenLogprob, ToolCall
from deployments.protocol.replica import GenerateChunk
from deployments.tools.calls import ToolCallText
from deployments.tools.plan import ToolPlan


@dataclass(frozen=True)
class Began:
    """A choice's first chunk: the notice to put before its text, and the prompt's tokens."""

    index: int
    notice: str | None = None  # the degraded-vision notice, before the choice's text
    prompt_tokens: int = 0  # as the first chunk counted them


@dataclass(frozen=True)
class Logprobs:
    """The logprobs of a chunk's tokens in one choice."""

    index: int
    tokens: list[TokenLogprob]


@dataclass(frozen=True)
class Text:
    """A run of a choice's answer text."""

    index: int
    text: str


@dataclass(frozen=True)
class Call:
    """A tool call's start (its id and name) or a fragment of its arguments, in one choice."""

    index: int
    delta: ToolCallDelta  # `id` and the name at a call's start; an arguments fragment after


@dataclass(frozen=True)
class Ended:
    """A choice's finish (`cut_short`: ended early, at a repeated tool call)."""

    index: int
    finish: ChoiceFinish
    stop_sequence: str | None = None  # the stop sequence that ended it, if one did
    cut_short: bool = False


Event = Began | Logprobs | Text | Call | Ended


class Answer:
    """The semantic events of an answer's `n` choices (`per_prompt` of them sharing each prompt: a
    legacy completion's), with their tool `plan` (None: the text as it comes) and the `notice`.
    """

    def __init__(
        self,
        n: int,
        plan: ToolPlan | None,
        notice: str | None = None,
        *,
        per_prompt: int | None = None,
        call_id_prefix: str = "call_",
    ) -> None:
        self.tally: Tally[ChoiceFinish] = Tally(n, per_prompt)
        self._notice = notice
        self._splits = [ToolCallText(plan, id_prefix=call_id_prefix) if plan else None for _ in range(n)]
        self._began = [False] * n

    def feed(self, chunk: GenerateChunk) -> list[Event]:
        """What `chunk` meant for its choice (nothing once the choice has ended)."""
        i = chunk.index
        if self.tally[i].finish is not None:  # ended early: the rest of its sequence is not the answer's
            return []
        events: list[Event] = []
        if not self._began[i]:
            self._began[i] = True
            events.append(Began(i, self._notice, chunk.prompt_tokens))
        if chunk.logprobs:
            events.append(Logprobs(i, chunk.logprobs))
        split = self._splits[i]
        if split is None:
            events.append(Text(i, chunk.text))
            if chunk.finish_reason is not None:
                events.append(self._end(chunk, chunk.finish_reason))
            return events
        if chunk.tool_format is not None:
            split.use(chunk.tool_format)
        events += self._pieces(i, split.feed(chunk.text))
        if split.stopped:
            events.append(self._end(chunk, "tool_calls", cut_short=True))
        elif chunk.finish_reason is not None:
            events += self._pieces(i, split.finish())
            whole_calls = bool(split.calls) and split.complete
            events.append(self._end(chunk, "tool_calls" if whole_calls else chunk.finish_reason))
        return events

    def calls(self, index: int) -> list[ToolCall]:
        """The tool calls that choice `index` announced."""
        split = self._splits[index]
        return split.calls if split is not None else []

    @staticmethod
    def _pieces(index: int, pieces: list[str | ToolCallDelta]) -> list[Event]:
        return [Text(index, piece) if isinstance(piece, str) else Call(index, piece) for piece in pieces]

    def _end(self, chunk: GenerateChunk, finish: ChoiceFinish, cut_short: bool = False) -> Ended:
        self.tally.end(chunk, finish, cut_short=cut_short)
        return Ended(chunk.index, finish, chunk.stop_sequence, cut_short)

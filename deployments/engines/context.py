"""Fitting a chat into the model's context: the completion limit, and `context_overflow`.

`fit_context` is pure and generic over the message type: an engine hands it the chat and a `count`
that renders and tokenizes a list of messages exactly as the engine would prompt with them (the chat
template; for a native VLM, the processor's expansion of each image into its placeholder run). A
message is therefore atomic: whatever a message holds (an image's placeholder run, a proxy caption
the ingress wrote into its text) is counted, kept or dropped as a whole, never cut.

- ``error`` (the default): the chat as it is, with `Limits.completion`: the request's `max_tokens`,
  or the model's default cut to the context left; a 400 `ContextLengthError` with the numbers when
  the prompt and the requested tokens cannot fit. (A legacy completion's prompt, never cut, uses
  `Limits.completion` alone.)
- ``truncate``: the oldest turns are dropped, whole, until the prompt leaves room for the request's
  `max_tokens` (or the model's default). A *turn* is a user message and the assistant and tool
  messages after it, up to the next user message (so a tool result never outlives its call; messages
  before the first user message are a turn of their own). System (and developer) messages are never
  dropped, wherever they are, nor is the last turn (the last user message and what follows it). When
  even that minimal chat cannot leave room, it is used with the rule of ``error`` (the default cut to
  the context left, or the same 400).

Usage, for any engine (the text engines, `engine: fake`, a native VLM's engine with its own count)::

    fitted = fit_context(request.messages, count, defaults.limits(max_model_len, request, params),
                         params.context_overflow)
    # prompt fitted.messages; fitted.max_tokens; report fitted.dropped_prompt_tokens in usage

`count` is called at most ``2 + ceil(log2(turns - 1))`` times: once for the whole chat (the only
call when it fits), once for the minimal chat, then a binary search for the fewest turns to drop (the
prompt shrinks as turns go). Every answer is checked by a real count, so a count that is not monotone
can only make the search drop more than needed, never return a chat that does not fit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from deployments.errors import ContextLengthError

Overflow = Literal["error", "truncate"]

_KEPT_ROLES = frozenset({"system", "developer"})


class Message(Protocol):
    """What `fit_context` reads of a message: its role (``system``, ``developer``, ``user``,
    ``assistant``, ``tool``).
    """

    @property
    def role(self) -> str: ...


M = TypeVar("M", bound=Message)
R = TypeVar("R")  # an engine's rendering of a chat


@dataclass(frozen=True)
class Fitted(Generic[M]):
    """A chat fitted to the context: the messages kept (in their order), their prompt tokens, the
    completion limit, and what truncation dropped (0 and 0 when nothing was).
    """

    messages: list[M]
    prompt_tokens: int
    max_tokens: int
    dropped_messages: int = 0
    dropped_prompt_tokens: int = 0


@dataclass(frozen=True)
class Limits:
    """A request's room: the model's context (`max_model_len`), the request's `max_tokens` (None:
    unset) and the model's default (`params.max_tokens`); `ceiling`: the request's `max_tokens` is a
    ceiling, cut to the context's room (Anthropic's Messages), not a 400.
    """

    max_model_len: int
    max_tokens: int | None
    default_max_tokens: int
    ceiling: bool = False

    @property
    def reserve(self) -> int:
        """The completion tokens that truncation leaves room for: the request's, else the default."""
        return self.max_tokens or self.default_max_tokens

    def completion(self, prompt_tokens: int, field: str = "messages", note: str = "") -> int:
        """The completion limit of a prompt that is not cut: the request's `max_tokens`, or the default
        cut to the context left. `ContextLengthError` (400) with the numbers when they cannot fit;
        `field`: the request's (``messages`` or ``prompt``); `note`: said after the prompt's size.
        """
        room = self.max_model_len - prompt_tokens
        wanted = self.max_tokens or min(self.default_max_tokens, room)
        if self.ceiling:
            wanted = min(wanted, room)
        if wanted <= room and room >= 1:
            return wanted
        prompt = f"This model's context is {self.max_model_len} tokens; the prompt has {prompt_tokens}{note}"
        if self.max_tokens is None or self.ceiling:  # only fails when the prompt leaves no room at all
            message = f"{prompt}, which leaves no room for the completion. Shorten the {field}."
        else:
            message = f"{prompt} and {wanted} completion tokens were requested. Shorten the {field} or max_tokens."
        raise ContextLengthError(message, param=field)


def turns(messages: Sequence[Message]) -> list[list[int]]:
    """The indices of the droppable messages, grouped by turn, oldest first: each user message
    starts a turn; system and developer messages belong to none.
    """
    grouped: list[list[int]] = []
    for i, message in enumerate(messages):
        if message.role in _KEPT_ROLES:
            continue
        if message.role == "user" or not grouped:
            grouped.append([])
        grouped[-1].append(i)
    return grouped


def fit_context(
    messages: list[M],
    count: Callable[[list[M]], int],
    limits: Limits,
    overflow: Overflow,
    note: Callable[[list[M]], str] = lambda _: "",
) -> Fitted[M]:
    """The chat as it will be prompted and its completion limit (see the module's docstring).
    `count(messages)`: the prompt tokens of those messages as the engine renders them (what it
    raises, e.g. a 400 for tools the template cannot render, propagates). Raises
    `ContextLengthError` (400) with the numbers; `note(messages)` is said after the prompt's size
    (e.g. how many of its tokens are image tokens).
    """
    total = count(messages)
    if overflow == "error" or total + limits.reserve <= limits.max_model_len:
        return Fitted(messages, total, limits.completion(total, note=note(messages)))

    groups = turns(messages)
    counts: dict[int, int] = {0: total}  # turns dropped -> prompt tokens

    def kept(dropped: int) -> list[M]:
        gone = {i for group in groups[:dropped] for i in group}
        return [m for i, m in enumerate(messages) if i not in gone]

    def fits(dropped: int) -> bool:
        if dropped not in counts:
            counts[dropped] = count(kept(dropped))
        return counts[dropped] + limits.reserve <= limits.max_model_len

    most = max(len(groups) - 1, 0)  # the last turn stays
    if fits(most):  # the fewest turns to drop: `lo` does not fit, `hi` does
        lo, hi = 0, most
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(mid) else (mid, hi)
        chosen, wanted = hi, limits.reserve
    else:  # even the minimal chat leaves no room for `reserve`: the rule of `error` on it
        dropped = f" after dropping every turn but the last ({total} before)" if most else ""
        chosen, wanted = most, limits.completion(counts[most], note=note(kept(most)) + dropped)
    chat = kept(chosen)
    return Fitted(chat, counts[chosen], wanted, len(messages) - len(chat), max(total - counts[chosen], 0))


def fit_rendered(
    messages: list[M],
    render: Callable[[list[M]], R],
    size: Callable[[R], int],
    limits: Limits,
    overflow: Overflow,
    note: Callable[[R], str] = lambda _: "",
) -> tuple[R, Fitted[M]]:
    """`fit_context` for an engine that renders a chat to count it (`render`, whose result has
    `size(...)` prompt tokens and is said in `note`): each candidate chat is rendered once, and the
    kept chat's rendering is returned with the fit.
    """
    rendered: dict[tuple[int, ...], R] = {}  # the chats counted, by their messages

    def of(chat: list[M]) -> R:
        key = tuple(map(id, chat))
        if key not in rendered:
            rendered[key] = render(chat)
        return rendered[key]

    fitted = fit_context(messages, lambda chat: size(of(chat)), limits, overflow, lambda chat: note(of(chat)))
    return of(fitted.messages), fitted

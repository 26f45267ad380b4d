"""`fit_context`: the completion limit, `context_overflow: error` and `truncate` (whole turns dropped,
system messages and the last user turn kept, nothing cut inside a message), on fake messages whose
token count is known exactly; then a property test on random conversations of text, image
placeholder runs (native) and captions (proxy)."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from deployments.engines.context import Fitted, Limits, fit_context, turns
from deployments.errors import ContextLengthError


@dataclass(frozen=True, eq=False)  # compared by identity: a kept message is the very one sent
class Msg:
    """A message as tokens: each part is ("text", n), ("image", id, k) or ("caption", id, n)."""

    role: str
    parts: tuple[tuple, ...] = ()
    call: str | None = None  # an assistant's tool call id, or the id a tool message answers
    name: str = ""


OVERHEAD = 3  # per message (role and separators), as a chat template adds


def render(messages: list[Msg]) -> list[str]:
    """The prompt's tokens: an image is a run of k placeholder tokens, a caption n words."""
    tokens: list[str] = ["<bos>"]
    for i, m in enumerate(messages):
        tokens += [f"<{m.role}>", "<start>", "<end>"]
        for part in m.parts:
            if part[0] == "text":
                tokens += [f"text{i}"] * part[1]
            else:
                kind, ident, n = part
                tokens += [f"{kind}{ident}"] * n
    return [*tokens, "<assistant>"]


class Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, messages: list[Msg]) -> int:
        self.calls += 1
        return len(render(messages))


def text(role: str, n: int, name: str = "") -> Msg:
    return Msg(role, (("text", n),), name=name)


def fit(messages: list[Msg], length: int, max_tokens: int | None = None, default: int = 10, overflow="truncate"):
    return fit_context(messages, Counting(), Limits(length, max_tokens, default), overflow)


def names(fitted: Fitted[Msg]) -> list[str]:
    return [m.name for m in fitted.messages]


CHAT = [
    text("system", 10, "sys"),
    text("user", 20, "u1"),
    text("assistant", 20, "a1"),
    text("user", 20, "u2"),
    Msg("assistant", (("text", 5),), call="c1", name="a2-call"),
    Msg("tool", (("text", 15),), call="c1", name="t2"),
    text("assistant", 10, "a2"),
    text("user", 20, "u3"),
]
WHOLE = len(render(CHAT))  # 1 + 8 * 3 + 140 + 1 = 166
LAST = len(render([CHAT[0], CHAT[-1]]))  # 1 + 6 + 30 + 1 = 38


def test_turns_start_at_user_messages_and_skip_system_ones():
    chat = [text("assistant", 1), text("system", 1), text("user", 1), text("tool", 1), text("developer", 1)]
    chat += [text("user", 1), text("assistant", 1)]
    assert turns(chat) == [[0], [2, 3], [5, 6]]


def test_a_chat_that_fits_is_kept_whole_with_one_count():
    count = Counting()
    fitted = fit_context(CHAT, count, Limits(WHOLE + 10, None, 10), "truncate")
    assert fitted == Fitted(CHAT, WHOLE, 10)
    assert count.calls == 1


def test_error_mode_is_a_400_with_the_numbers():
    with pytest.raises(ContextLengthError) as raised:
        fit(CHAT, WHOLE + 5, max_tokens=10, overflow="error")
    assert raised.value.message == (
        f"This model's context is {WHOLE + 5} tokens; the prompt has {WHOLE} and 10 completion tokens were "
        "requested. Shorten the messages or max_tokens."
    )
    assert raised.value.param == "messages" and raised.value.code == "context_length_exceeded"


def test_error_mode_cuts_the_default_to_the_context_left():
    assert fit(CHAT, WHOLE + 4, default=10, overflow="error").max_tokens == 4
    with pytest.raises(ContextLengthError, match=f"the prompt has {WHOLE}, which leaves no room"):
        fit(CHAT, WHOLE, overflow="error")


def test_a_ceiling_max_tokens_is_cut_to_the_context_left():
    """Anthropic's `max_tokens` is a ceiling: cut to the room, and a prompt that leaves none is the
    context error with the numbers (Claude Code reads them to offer /compact)."""
    assert Limits(100, 32000, 10, ceiling=True).completion(60) == 40
    assert Limits(100, 8, 10, ceiling=True).completion(60) == 8
    with pytest.raises(ContextLengthError, match="the prompt has 120, which leaves no room"):
        Limits(100, 32000, 10, ceiling=True).completion(120)
    with pytest.raises(ContextLengthError, match="and 32000 completion tokens were requested"):
        Limits(100, 32000, 10).completion(60)  # OpenAI's APIs: a 400, as vLLM


def test_truncation_drops_the_oldest_whole_turns_keeping_system_and_last_user():
    one_turn = len(render([CHAT[1], CHAT[2]])) - 2  # u1 + a1: 6 + 40 (not the <bos> and <assistant>)
    fitted = fit(CHAT, WHOLE - one_turn + 10, max_tokens=10)
    assert names(fitted) == ["sys", "u2", "a2-call", "t2", "a2", "u3"]
    assert (fitted.prompt_tokens, fitted.max_tokens) == (WHOLE - one_turn, 10)
    assert (fitted.dropped_messages, fitted.dropped_prompt_tokens) == (2, one_turn)


def test_a_tool_answer_goes_with_its_call():
    """One token short of keeping the second turn: its call and the tool's answer go together."""
    fitted = fit(CHAT, LAST + 10 + 1, max_tokens=10)
    assert names(fitted) == ["sys", "u3"]
    assert fitted.dropped_prompt_tokens == WHOLE - LAST


def test_truncation_makes_room_for_the_default_max_tokens():
    """Without max_tokens, truncation leaves room for the default rather than cutting it."""
    fitted = fit(CHAT, WHOLE + 5, default=10)
    assert fitted.max_tokens == 10 and fitted.dropped_messages == 2


def test_when_even_the_last_turn_leaves_no_room_for_the_default_it_is_cut():
    fitted = fit(CHAT, LAST + 4, default=10)
    assert names(fitted) == ["sys", "u3"] and fitted.max_tokens == 4


def test_when_even_the_last_turn_cannot_fit_it_is_the_400_with_the_numbers():
    with pytest.raises(ContextLengthError) as raised:
        fit(CHAT, LAST + 9, max_tokens=10)
    assert raised.value.message == (
        f"This model's context is {LAST + 9} tokens; the prompt has {LAST} after dropping every turn but the "
        f"last ({WHOLE} before) and 10 completion tokens were requested. Shorten the messages or max_tokens."
    )


def test_a_single_turn_is_never_dropped():
    chat = [text("user", 50)]
    with pytest.raises(ContextLengthError, match="the prompt has 55 and 10 completion"):
        fit(chat, 60, max_tokens=10)
    assert fit(chat, 60).max_tokens == 5  # the default, cut


def test_system_messages_anywhere_are_kept():
    chat = [text("user", 30, "u1"), text("system", 2, "mid"), text("assistant", 30, "a1"), text("user", 5, "u2")]
    fitted = fit(chat, 40, max_tokens=10)
    assert names(fitted) == ["mid", "u2"]


def test_count_calls_are_logarithmic_in_the_turns():
    chat = [text("system", 5)] + [text(role, 5) for _ in range(100) for role in ("user", "assistant")]
    count = Counting()
    total = count(chat)
    count.calls = 0
    fitted = fit_context(chat, count, Limits(total // 2, 10, 10), "truncate")
    assert fitted.prompt_tokens + 10 <= total // 2
    assert count.calls <= 2 + math.ceil(math.log2(99))


# --------------------------------------------------------------------------- property

_ids = itertools.count()


@st.composite
def parts(draw) -> tuple[tuple, ...]:
    """Text, image placeholder runs (native: k tokens) and captions (proxy: n words), mixed."""
    kinds = draw(st.lists(st.sampled_from(["text", "image", "caption"]), max_size=4))
    out = []
    for kind in kinds:
        if kind == "text":
            out.append(("text", draw(st.integers(1, 30))))
        else:
            out.append((kind, next(_ids), draw(st.integers(1, 40))))
    return tuple(out)


@st.composite
def conversations(draw) -> list[Msg]:
    """Turns (a user message, then answers: plain, or a tool call and its results), a possible
    preamble before the first user message, and system messages anywhere."""
    chat: list[Msg] = []
    if draw(st.booleans()):
        chat.append(Msg("assistant", draw(parts())))
    for _ in range(draw(st.integers(1, 8))):
        chat.append(Msg("user", draw(parts())))
        for _ in range(draw(st.integers(0, 2))):
            if draw(st.booleans()):
                call = f"call{next(_ids)}"
                chat.append(Msg("assistant", draw(parts()), call=call))
                chat += [Msg("tool", draw(parts()), call=call) for _ in range(draw(st.integers(1, 2)))]
            else:
                chat.append(Msg("assistant", draw(parts())))
    for _ in range(draw(st.integers(0, 2))):
        chat.insert(draw(st.integers(0, len(chat))), Msg(draw(st.sampled_from(["system", "developer"])), draw(parts())))
    return chat


def whole_runs(tokens: list[str], chat: list[Msg]) -> bool:
    """Every image run and caption of the chat is in the prompt whole (all its tokens) or not at all."""
    seen = Counter(tokens)
    sizes = {f"{p[0]}{p[1]}": p[2] for m in chat for p in m.parts if p[0] != "text"}
    return all(seen[tag] in (0, n) for tag, n in sizes.items())


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    chat=conversations(),
    length=st.integers(20, 600),
    max_tokens=st.none() | st.integers(1, 100),
    default=st.integers(1, 100),
)
def test_truncation_never_splits_an_image_or_caption_and_keeps_system_and_last_turn(chat, length, max_tokens, default):
    count = Counting()
    limits = Limits(length, max_tokens, default)
    non_system = [m for m in chat if m.role not in ("system", "developer")]
    last_user = max(i for i, m in enumerate(non_system) if m.role == "user")
    minimal = [m for m in chat if m.role in ("system", "developer") or m in non_system[last_user:]]
    try:
        fitted = fit_context(chat, count, limits, "truncate")
    except ContextLengthError as exc:  # only when even system + last turn leave no room
        event("400")
        assert len(render(minimal)) + (max_tokens or 1) > length
        assert str(len(render(minimal))) in exc.message and str(length) in exc.message
        return
    kept = fitted.messages
    tokens = render(kept)
    event("truncated" if fitted.dropped_messages else "whole")
    # nothing inside a message is cut: the very messages sent, every image run and caption whole
    assert all(any(k is m for m in chat) for k in kept)
    assert whole_runs(tokens, chat)
    # system messages and the last user turn kept; the rest is a suffix of whole turns, in order
    assert [m for m in kept if m.role in ("system", "developer")] == [
        m for m in chat if m.role in ("system", "developer")
    ]
    kept_turns = [m for m in kept if m.role not in ("system", "developer")]
    assert kept_turns == non_system[len(non_system) - len(kept_turns) :]
    assert non_system[last_user:] == kept_turns[len(kept_turns) - (len(non_system) - last_user) :]
    starts = {i for i, m in enumerate(non_system) if m.role == "user"} | {0}
    assert len(non_system) - len(kept_turns) in starts  # the cut falls between turns
    assert kept == [m for m in chat if any(m is k for k in kept)]  # original order
    # a tool answer is kept only with its call
    calls = {m.call for m in kept if m.role == "assistant" and m.call}
    assert all(m.call in calls for m in kept if m.role == "tool")
    # it fits, and the figures are right
    assert fitted.prompt_tokens == len(tokens) and fitted.max_tokens >= 1
    assert fitted.prompt_tokens + fitted.max_tokens <= length
    assert fitted.dropped_prompt_tokens == len(render(chat)) - len(tokens)
    assert fitted.dropped_messages == len(chat) - len(kept)
    if max_tokens is not None:
        assert fitted.max_tokens == max_tokens
    # fewest turns dropped: one more turn back would not leave room for the completion
    if fitted.dropped_messages:
        cut = len(non_system) - len(kept_turns)
        back = max(s for s in starts if s < cut)
        longer = [m for m in chat if m.role in ("system", "developer") or m in non_system[back:]]
        assert len(render(longer)) + limits.reserve > length
    assert count.calls <= 2 + math.ceil(math.log2(max(len(starts) - 1, 1)))  # starts: one per turn

"""The routing rule (`routing.choice`) without Ray: the warm replica wins within the load bound, what
every replica holds decides nothing, adapters are respected, ties spread."""

from __future__ import annotations

import random
from collections import Counter

from deployments.routing.choice import Candidate, LoadRule, choose

RULE = LoadRule(imbalance=2)


def two(load_a: int = 0, load_b: int = 0, capacity: int = 16, **adapters: frozenset[str]) -> list[Candidate]:
    return [
        Candidate("a", load_a, capacity, adapters.get("a", frozenset())),
        Candidate("b", load_b, capacity, adapters.get("b", frozenset())),
    ]


def test_the_replica_holding_the_longer_prefix_wins():
    choice = choose(two(), {"a": 3, "b": 30}, RULE, rng=random.Random(0))
    assert choice is not None
    assert (choice.replica, choice.decision, choice.matched) == ("b", "warm", 30)
    assert choice.ranked == [["b"], ["a"]]


def test_a_warm_replica_within_the_bound_wins_over_an_idle_one():
    choice = choose(two(load_a=0, load_b=2), {"b": 30}, RULE)
    assert choice is not None and (choice.replica, choice.decision) == ("b", "warm")


def test_past_the_bound_the_least_busy_wins():
    choice = choose(two(load_a=0, load_b=3), {"b": 30}, RULE)
    assert choice is not None and (choice.replica, choice.decision) == ("a", "load_fallback")


def test_a_full_replica_is_never_first():
    choice = choose(two(load_a=1, load_b=4, capacity=4), {"b": 30}, LoadRule(imbalance=100))
    assert choice is not None and choice.ranked == [["a"]]


def test_a_prefix_every_replica_holds_is_not_warm():
    """A system prompt both replicas hold (10 blocks) decides nothing: the least busy gets the request."""
    choice = choose(two(load_a=2, load_b=0), {"a": 10, "b": 10}, RULE, rng=random.Random(1))
    assert choice is not None and (choice.replica, choice.decision) == ("b", "no_match")
    deeper = choose(two(load_a=2, load_b=0), {"a": 12, "b": 10}, RULE)
    assert deeper is not None and (deeper.replica, deeper.decision, deeper.shared) == ("a", "warm", 10)


def test_new_sessions_behind_a_shared_prompt_spread_over_the_replicas():
    """The hot spot of vLLM production-stack #957: six sessions that start with one system prompt. The
    first makes the prompt warm on one replica; the load bound sends one elsewhere; from then on both
    hold it and new sessions go by load."""
    held: dict[str, int] = {}
    loads = {"a": 0, "b": 0}
    for _ in range(6):
        candidates = [Candidate(r, loads[r], 16) for r in ("a", "b")]
        choice = choose(candidates, held, RULE, rng=random.Random(7))
        assert choice is not None
        loads[choice.replica] += 1  # each session's turn is still running
        held[choice.replica] = 24  # the shared prompt's blocks
    assert sorted(loads.values()) == [3, 3]


def test_ties_spread_a_burst():
    """Equal scores in a burst do not all pick one replica (llm-d-router #2515): chance breaks ties."""
    picks = Counter(
        choose(two(), {}, RULE, rng=random.Random(seed)).replica  # type: ignore[union-attr]
        for seed in range(40)
    )
    assert picks["a"] > 5 and picks["b"] > 5


def test_the_session_hint_breaks_ties_within_the_bound():
    choice = choose(two(load_a=1, load_b=0), {}, RULE, session_replica="a")
    assert choice is not None and (choice.replica, choice.decision) == ("a", "session")
    busy = choose(two(load_a=3, load_b=0), {}, RULE, session_replica="a")
    assert busy is not None and (busy.replica, busy.decision) == ("b", "no_match")
    warm_elsewhere = choose(two(), {"b": 5}, RULE, session_replica="a")
    assert warm_elsewhere is not None and warm_elsewhere.replica == "b"


def test_an_adapter_goes_only_where_it_is_held():
    holder = {"b": frozenset({"sql"})}
    choice = choose(two(load_a=0, load_b=6, **holder), {"a": 40}, RULE, adapter="sql")
    assert choice is not None and choice.ranked == [["b"]]


def test_an_adapter_whose_holders_are_full_may_go_elsewhere():
    holder = {"b": frozenset({"sql"})}
    choice = choose(two(load_a=0, load_b=4, capacity=4, **holder), {}, RULE, adapter="sql")
    assert choice is not None and choice.replica == "a"


def test_no_candidates_no_choice():
    assert choose([], {}, RULE) is None


def test_a_session_under_an_adapter_one_replica_holds_is_warm_there():
    """Its holder is the only replica it may go to; it is warm there when the others hold less of it."""
    holder = {"b": frozenset({"sql"})}
    choice = choose(two(**holder), {"b": 12}, RULE, adapter="sql", session_replica="b")
    assert choice is not None and (choice.replica, choice.decision) == ("b", "warm")

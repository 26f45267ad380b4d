"""The routing rule, apart from Ray: given the candidate replicas (their load, capacity and adapters)
and how deep each holds the request's prefix, rank them.

1. **Adapters**: a request for an adapter goes only to replicas that hold it, while one of them has
   room; only when all of those are full may another (the one with the fewest adapters first) load
   it. A prefix under one adapter is never matched under another (`keys`).
2. **What all replicas share is not warm**: a replica is warm for a request when it holds more of
   the request's prefix than every other candidate does (`depth > floor`, the floor being the least
   any candidate with room holds, its adapter or not). A system prompt that every replica holds
   decides nothing, so it cannot pull every session to one replica. Nor does one that only some hold
   yet: the router counts a match that stops inside a longer prompt it sent to that replica as none
   (`PrefixIndex.branched`: a new session leaves there the chain of the session that came first), so
   new sessions behind one system prompt go by load from the first, and soon every replica holds it.
3. **Load bound**: a warm replica wins while its ongoing requests are at most `LoadRule.imbalance`
   above the least busy candidate's; past that, the least busy wins (``load_fallback``).
4. **Ties**: among equally deep replicas within the bound, the session's last replica (a client's
   hint: `x-session-id`, a conversation, a user id) and then the least busy, then chance, so that a
   burst of equal requests spreads instead of all picking one (llm-d-router #2515).

Decisions: ``warm`` (the deepest match within the bound), ``session`` (no replica deeper than the
floor; the hinted one, within the bound), ``load_fallback`` (a deeper match exists, but too busy),
``no_match`` (the least busy).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Decision = Literal["warm", "session", "load_fallback", "no_match"]
DECISIONS: tuple[Decision, ...] = ("warm", "session", "load_fallback", "no_match")


@dataclass(frozen=True)
class Candidate:
    """A replica as the rule sees it: `load` its ongoing requests (as last known plus those this
    router has picked it for and not yet sent), `capacity` its max_ongoing_requests.
    """

    id: str
    load: int
    capacity: int
    adapters: frozenset[str] = frozenset()

    @property
    def full(self) -> bool:
        return self.load >= self.capacity


@dataclass(frozen=True)
class LoadRule:
    """`imbalance`: how many more ongoing requests than the least busy replica a warm replica may
    have and still be chosen (the builder's default: a quarter of max_num_seqs, at least 2).
    """

    imbalance: int = 2


@dataclass(frozen=True)
class Choice:
    """Replica ids, most preferred first (each alone in its rank, as Serve's ranks are tried in
    order), the decision, the chosen replica's matched blocks and the load spread (busiest minus
    least busy among the candidates).
    """

    ranked: list[list[str]]
    decision: Decision
    matched: int = 0
    spread: int = 0
    shared: int = field(default=0)  # blocks every candidate holds (the floor)

    @property
    def replica(self) -> str:
        return self.ranked[0][0]


def pool_of(candidates: Sequence[Candidate], adapter: str | None) -> list[Candidate]:
    """The replicas a request may go to: those with room (all, when none has), and of them those
    holding its `adapter` when one does (else those with the fewest adapters first).
    """
    open_ = [c for c in candidates if not c.full] or list(candidates)
    if not adapter:
        return open_
    holders = [c for c in open_ if adapter in c.adapters]
    if holders:
        return holders
    if any(adapter in c.adapters for c in candidates):  # its holders are all full: another may load it
        return sorted(open_, key=lambda c: len(c.adapters))
    return open_


def choose(
    candidates: Sequence[Candidate],
    depth: Mapping[str, int],
    rule: LoadRule,
    *,
    adapter: str | None = None,
    session_replica: str | None = None,
    rng: random.Random | None = None,
) -> Choice | None:
    """Rank `candidates` for a request whose prefix each holds `depth[id]` blocks of (see the module's
    docstring); None when there are no candidates.
    """
    pool = pool_of(candidates, adapter)
    if not pool:
        return None
    rng = rng or random.Random()
    jitter = {c.id: rng.random() for c in pool}
    held = {c.id: depth.get(c.id, 0) for c in pool}
    least = min(c.load for c in pool)
    spread = max(c.load for c in pool) - least
    # The floor is over every replica with room, not the adapter's holders alone: a session under an
    # adapter that one replica holds is warm there when the others hold less of it.
    floor = min(depth.get(c.id, 0) for c in [c for c in candidates if not c.full] or candidates)
    best = max(held.values())
    near = [c for c in pool if c.load - least <= rule.imbalance]

    def busy_order(c: Candidate) -> tuple[int, int, float]:
        return (c.load, -held[c.id], jitter[c.id])

    decision: Decision
    deepest_near = max(held[c.id] for c in near)
    if deepest_near > floor:
        tied = [c for c in near if held[c.id] == deepest_near]
        chosen = min(tied, key=lambda c: (c.id != session_replica, *busy_order(c)))
        decision = "warm" if deepest_near == best else "load_fallback"
    elif best > floor:
        chosen = min(pool, key=busy_order)
        decision = "load_fallback"
    else:
        hinted = [c for c in near if c.id == session_replica]
        chosen = hinted[0] if hinted else min(pool, key=busy_order)
        decision = "session" if hinted else "no_match"
    rest = sorted((c for c in pool if c.id != chosen.id), key=busy_order)
    return Choice(
        ranked=[[chosen.id]] + [[c.id] for c in rest],
        decision=decision,
        matched=held[chosen.id],
        spread=spread,
        shared=floor,
    )

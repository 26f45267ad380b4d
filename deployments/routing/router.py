"""`PrefixRouter`: Ray Serve's `RequestRouter` for the decoder deployments (`request_router_config`,
set by the builder: `options.routing`). Every process that holds a decoder handle (the ingress
replicas) runs one per decoder deployment; each keeps its own `PrefixIndex` of where it sent which
prefix, corrected by what the replicas report (`record_routing_stats`, `HeldPrefixes`).

A call with a `GenerateRequest` is ranked by `choice.choose` on its prefix blocks (`keys`); any other
call (tokenize, detokenize) goes to the least busy replica. The rule, the decisions and the hints
are `choice`'s; the metrics (`ROUTING_METRICS`) are recorded here, once per request routed.

Ray's `MultiplexMixin` keeps which replicas hold which adapters; no `FIFOMixin`: a replica chosen
for a request's prefix must serve that request, not the oldest one waiting.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import weakref
from collections import OrderedDict
from typing import Any

from ray.serve._private.common import ReplicaID
from ray.serve._private.replica_result import ReplicaResult
from ray.serve.request_router import MultiplexMixin, PendingRequest, RequestRouter, RunningReplica

from deployments.protocol.replica import GenerateRequest
from deployments.routing.choice import Candidate, Choice, LoadRule, choose
from deployments.routing.index import PrefixIndex
from deployments.routing.keys import prefix_blocks

logger = logging.getLogger("ray.serve")

MAX_SESSIONS = 16_384  # session hints remembered (LRU)
MAX_IN_FLIGHT = 4_096  # requests being routed whose choice is kept until they are sent
REPORT_MARGIN_S = 1.0  # a request sent this long before a replica's report may not be in it yet


class PrefixRouter(MultiplexMixin, RequestRouter):
    """Prefix-cache-aware, load-bounded routing for a decoder deployment (see the module's docstring).

    `request_router_kwargs`: `model` (metrics' label), `imbalance` (`LoadRule.imbalance`) and
    `index_blocks` (the `PrefixIndex`'s capacity).
    """

    def initialize_state(self, model: str = "", imbalance: int = 2, index_blocks: int = 65_536, **_: Any) -> None:
        self._model = model or self._deployment_id.name
        self._rule = LoadRule(imbalance=imbalance)
        self._index = PrefixIndex(index_blocks)
        self._sessions: OrderedDict[str, str] = OrderedDict()  # session hint -> replica it last went to
        # id(pending request) -> (it, its blocks, its choice): by the object, not `internal_request_id`, which
        # a handle call inherits from the request it is made in (two decoder calls of one request share it).
        self._routing: OrderedDict[int, tuple[PendingRequest, tuple[int, ...], Choice]] = OrderedDict()
        self._picked: dict[str, int] = {}  # replica -> requests chosen for it and not yet sent
        self._reports: dict[str, Any] = {}  # replica -> the `at` of its last report applied
        # routing task -> the request it is choosing for (`_fulfill_next_pending_request`)
        self._choosing: weakref.WeakKeyDictionary[asyncio.Task[Any], PendingRequest] = weakref.WeakKeyDictionary()
        self._rng = random.Random()
        self._metrics: Any = None
        try:
            from deployments.monitoring.metrics import ROUTING_METRICS, Recorder

            self._metrics = Recorder(ROUTING_METRICS, self._model)
            self._metrics.export_zeros()
        except Exception:  # metrics are an aid: a router without them still routes
            logger.warning("decoder router for %s: no metrics", self._model, exc_info=True)

    # ------------------------------------------------------------------ choosing

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        loads = await self._loads(candidate_replicas)
        candidates = [
            Candidate(
                r.replica_id.unique_id,
                loads[r.replica_id.unique_id] + self._picked.get(r.replica_id.unique_id, 0),
                r.max_ongoing_requests,
                frozenset(r.multiplexed_model_ids),
            )
            for r in candidate_replicas
        ]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        request = _generate_request(pending_request)
        if request is None or pending_request is None:
            order = sorted(candidates, key=lambda c: (c.load, self._rng.random()))
            return [[by_id[c.id]] for c in order]
        task = asyncio.current_task()
        if task is not None:
            self._choosing[task] = pending_request
        metadata = pending_request.metadata
        adapter = metadata.multiplexed_model_id or None
        known = self._routing.get(id(pending_request))
        blocks = known[1] if known is not None else prefix_blocks(request, adapter)
        session = getattr(metadata, "session_id", "") or None
        depth = self._index.match(blocks, by_id)
        for replica in self._index.branched(blocks, depth):
            depth[replica] = 0  # a beginning shared with other prompts there decides nothing (`choice`, 2)
        choice = choose(
            candidates,
            depth,
            self._rule,
            adapter=adapter,
            session_replica=self._sessions.get(session) if session else None,
            rng=self._rng,
        )
        if choice is None:
            return []
        if known is not None:
            self._unpick(known[2].replica)
        self._routing[id(pending_request)] = (pending_request, blocks, choice)
        self._routing.move_to_end(id(pending_request))
        while len(self._routing) > MAX_IN_FLIGHT:
            _, (_, _, dropped) = self._routing.popitem(last=False)
            self._unpick(dropped.replica)
        self._picked[choice.replica] = self._picked.get(choice.replica, 0) + 1
        return [[by_id[rank[0]]] for rank in choice.ranked if rank[0] in by_id]

    def _fulfill_next_pending_request(self, replica: RunningReplica, request_metadata: Any = None) -> None:
        """Give `replica` to the request this routing task chose it for. Serve matches a choice to its
        request by `internal_request_id` alone, which every handle call made while serving one request
        shares: a second decoder call of one request (a legacy completion's second prompt) would never
        be matched, and would wait forever (Serve's `FIFOMixin` would hand it the first waiting request
        instead, whatever its prompt).
        """
        task = asyncio.current_task()
        own = self._choosing.pop(task, None) if task is not None else None
        if own is None or own.future.done():
            super()._fulfill_next_pending_request(replica, request_metadata)
            return
        self._record_queue_wait_time(own)
        own.future.set_result(replica)
        if self._pending_requests_by_id.get(own.metadata.internal_request_id) is own:
            self._remove_pending_request_from_indices(own)

    async def _loads(self, replicas: list[RunningReplica]) -> dict[str, int]:
        """Ongoing requests per replica: Serve's queue-length cache, probed where it has none (a
        replica that does not answer counts as full).
        """
        loads: dict[str, int] = {}
        missing = []
        for r in replicas:
            cached = self._replica_queue_len_cache.get(r.replica_id)
            if cached is None:
                missing.append(r)
            else:
                loads[r.replica_id.unique_id] = cached
        if missing:
            for r, length in await self._probe_queue_lens(missing, 0):
                loads[r.replica_id.unique_id] = r.max_ongoing_requests if length is None else length
        return loads

    def _unpick(self, replica: str) -> None:
        count = self._picked.get(replica, 0) - 1
        if count > 0:
            self._picked[replica] = count
        else:
            self._picked.pop(replica, None)

    # ------------------------------------------------------------------ what happened

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult) -> None:
        """The request went to `replica_id`: its prefix is recorded there, its session follows it."""
        metadata = pending_request.metadata
        known = self._routing.pop(id(pending_request), None)
        if known is None:
            return
        _, blocks, choice = known
        self._unpick(choice.replica)
        replica = replica_id.unique_id
        now = time.time()
        if blocks:
            self._index.insert(blocks, replica, now)
        session = getattr(metadata, "session_id", "") or None
        if session:
            self._sessions[session] = replica
            self._sessions.move_to_end(session)
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        decision = choice.decision if replica == choice.replica else "load_fallback"  # the first rank was full
        if self._metrics is not None:
            self._metrics.inc("routing_decisions", tags={"decision": decision})
            self._metrics.inc("routing_requests", tags={"decoder_replica": replica})
            self._metrics.set("routing_load_spread", choice.spread)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """A request ended; one still kept here was never routed (rejected, or cancelled while waiting):
        its choice is dropped. Of the requests sharing its id, those still waiting to be sent (their
        future not yet set) keep theirs.
        """
        for key, (pending, _, choice) in list(self._routing.items()):
            if pending.metadata.internal_request_id == internal_request_id and pending.future.done():
                del self._routing[key]
                self._unpick(choice.replica)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """Serve's replica set changed (or a replica's routing stats did): a replica that left is
        forgotten, a report newer than the last one applied corrects the index.
        """
        super().update_replicas(replicas)
        current = {r.replica_id.unique_id for r in replicas}
        for gone in (self._index.replicas() | set(self._reports)) - current:
            self._forget(gone)
        for r in replicas:
            stats = r.routing_stats or {}
            at, blocks = stats.get("at"), stats.get("blocks")
            rid = r.replica_id.unique_id
            if isinstance(at, int | float) and isinstance(blocks, list) and self._reports.get(rid) != at:
                self._reports[rid] = at
                self._index.correct(rid, set(blocks), float(at) - REPORT_MARGIN_S)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget(replica_id.unique_id)

    def _forget(self, replica: str) -> None:
        self._index.forget(replica)
        self._reports.pop(replica, None)
        self._picked.pop(replica, None)
        for session in [s for s, r in self._sessions.items() if r == replica]:
            del self._sessions[session]


def _generate_request(pending_request: PendingRequest | None) -> GenerateRequest | None:
    if pending_request is None:
        return None
    for arg in (*pending_request.args, *pending_request.kwargs.values()):
        if isinstance(arg, GenerateRequest):
            return arg
    return None

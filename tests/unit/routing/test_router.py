"""`PrefixRouter`, Ray Serve's own `RequestRouter` subclass, driven without a cluster: fake replicas
(the attributes and the queue-length probe the router reads), real pending requests."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from typing import Any

from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID, RequestMetadata
from ray.serve.request_router import PendingRequest

from deployments.protocol.replica import GenerateRequest, TextMessage, TokenizeInput
from deployments.routing.held import HeldPrefixes
from deployments.routing.keys import prefix_blocks
from deployments.routing.router import PrefixRouter

DEPLOYMENT = DeploymentID(name="PrimaryDecoder", app_name="default")
_ids = itertools.count()


class FakeReplica:
    """What the router reads of Serve's `RunningReplica`; `load` is what its queue-length probe answers."""

    def __init__(self, name: str, load: int = 0, adapters: tuple[str, ...] = ()) -> None:
        self.replica_id = ReplicaID(unique_id=name, deployment_id=DEPLOYMENT)
        self.load = load
        self.max_ongoing_requests = 16
        self.multiplexed_model_ids = set(adapters)
        self.routing_stats: dict[str, Any] = {}
        self.node_id, self.availability_zone = "node", None

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return self.load


def session(name: str, turns: int) -> GenerateRequest:
    """A session's request at turn `turns`: its own long system text, then the turns so far."""
    messages = [TextMessage(role="system", content=f"You are {name}'s assistant. " + f"{name} notes. " * 300)]
    for turn in range(turns):
        messages += [
            TextMessage(role="user", content=f"question {turn} from {name}"),
            TextMessage(role="assistant", content=f"answer {turn} " * 20),
        ]
    return GenerateRequest(messages=[*messages, TextMessage(role="user", content="next")])


async def started(*replicas: FakeReplica, imbalance: int = 2) -> PrefixRouter:
    router = PrefixRouter(
        deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.UNKNOWN, use_replica_queue_len_cache=True
    )
    router.initialize_state(model="m", imbalance=imbalance)
    router.update_replicas(list(replicas))
    await asyncio.sleep(0)  # its probe of the new replicas' queues
    return router


async def route(router: PrefixRouter, request: Any, adapter: str = "", session_id: str = "") -> str:
    """Route like Serve: the first rank is taken, and the router is told where the request went."""
    metadata = RequestMetadata(
        request_id="r", internal_request_id=f"i{next(_ids)}", multiplexed_model_id=adapter, session_id=session_id
    )
    pending = PendingRequest(args=[request], kwargs={}, metadata=metadata)
    ranks = await router.choose_replicas(router._replicas_list, pending)
    replica = ranks[0][0]
    router.on_request_routed(pending, replica.replica_id, None)  # type: ignore[arg-type]
    return replica.replica_id.unique_id


async def test_each_session_stays_on_the_replica_that_holds_it_and_sessions_spread():
    a, b = FakeReplica("a"), FakeReplica("b")
    router = await started(a, b)
    first = {}
    for name in ("s1", "s2", "s3", "s4"):
        first[name] = await route(router, session(name, 0))
        router.on_send_request((a if first[name] == "a" else b).replica_id)  # its first turn is still running
    assert sorted(first.values()) == ["a", "a", "b", "b"]  # no match anywhere: by load
    for turn in range(1, 4):
        for name, replica in first.items():
            assert await route(router, session(name, turn)) == replica


def behind_one_system_prompt(name: str, turns: int) -> GenerateRequest:
    """A session as `session` makes it, behind one system prompt that every session shares first."""
    common = TextMessage(role="system", content="You are a coding agent. " + "Follow the house rules. " * 200)
    own = session(name, turns)
    return own.model_copy(update={"messages": [common, *own.messages]})


async def test_new_sessions_behind_one_system_prompt_spread_from_the_first_and_then_stay():
    """vLLM production-stack #957's hot spot, with the builder's default bound for 16 slots (4): six
    sessions whose first turns all start while the first is still running. Before, the replica that
    took the first held the common prompt alone and drew the next four (5 / 1); a match that leaves
    another session's chain counts as none, so they go by load, and each then stays where it began."""
    a, b = FakeReplica("a"), FakeReplica("b")
    router = await started(a, b, imbalance=4)
    first = {}
    for i in range(6):
        name = f"s{i}"
        first[name] = await route(router, behind_one_system_prompt(name, 0))
        router.on_send_request((a if first[name] == "a" else b).replica_id)  # its first turn is still running
    assert sorted(Counter(first.values()).values()) == [3, 3]
    for turn in range(1, 3):
        for name, home in first.items():
            assert await route(router, behind_one_system_prompt(name, turn)) == home


async def test_a_busy_warm_replica_loses_to_the_least_busy_one():
    a, b = FakeReplica("a"), FakeReplica("b")
    router = await started(a, b, imbalance=2)
    home = await route(router, session("s", 0))
    other = b if home == "a" else a
    (a if home == "a" else b).load = 5
    other.load = 0
    router.replica_queue_len_cache.update((a if home == "a" else b).replica_id, 5)
    router.replica_queue_len_cache.update(other.replica_id, 0)
    assert await route(router, session("s", 1)) == other.replica_id.unique_id


async def test_a_replica_report_corrects_the_record():
    """A replica that no longer holds a session's prefix says so; one that holds what another router
    sent there says that too."""
    a, b = FakeReplica("a"), FakeReplica("b")
    router = await started(a, b)
    home = await route(router, session("s", 0))
    replica = a if home == "a" else b
    replica.routing_stats = {"at": time.time() + 5, "blocks": []}  # its engine dropped everything
    router.update_replicas([a, b])
    assert router._index.blocks_of(home) == 0
    elsewhere = b if home == "a" else a
    held = HeldPrefixes(slots=4)
    held.served(prefix_blocks(session("t", 0)))
    elsewhere.routing_stats = held.report()
    router.update_replicas([a, b])
    assert await route(router, session("t", 1)) == elsewhere.replica_id.unique_id


async def test_a_replica_that_left_is_forgotten_and_a_new_one_starts_empty():
    a, b = FakeReplica("a"), FakeReplica("b")
    router = await started(a, b)
    homes = {name: await route(router, session(name, 0)) for name in ("s1", "s2", "s3", "s4")}
    gone = "a"
    c = FakeReplica("c")
    router.update_replicas([b, c])
    await asyncio.sleep(0)
    assert gone not in router._index.replicas()
    assert router._index.blocks_of("c") == 0
    for name, home in homes.items():
        moved = await route(router, session(name, 1))
        assert moved == "b" if home == "b" else moved in {"b", "c"}


async def test_an_adapter_session_never_lands_where_the_adapter_is_not():
    a, b = FakeReplica("a", adapters=("sql",)), FakeReplica("b")
    router = await started(a, b)
    await route(router, session("s", 0))  # the base model's prefix, on either
    for turn in range(3):
        assert await route(router, session("s", turn), adapter="sql") == "a"


async def test_the_session_hint_breaks_a_tie():
    a, b = FakeReplica("a"), FakeReplica("b")
    router = await started(a, b)
    short = GenerateRequest(messages=[TextMessage(role="user", content="hi")])  # too short to key
    home = await route(router, short, session_id="conv-1")
    for _ in range(5):
        assert await route(router, short, session_id="conv-1") == home


async def test_a_call_without_a_prompt_goes_to_the_least_busy():
    a, b = FakeReplica("a", load=3), FakeReplica("b", load=0)
    router = await started(a, b)
    assert await route(router, TokenizeInput(prompt="hello")) == "b"


async def test_two_calls_of_one_request_are_routed_each_by_its_own_prompt():
    """A handle call inherits `internal_request_id` from the request it is made in: two decoder calls
    of one ingress request, chosen before either is sent, still go each to its own prompt's replica."""
    a, b = FakeReplica("a"), FakeReplica("b")
    router = await started(a, b)
    homes = {"s1": await route(router, session("s1", 0))}
    for replica, load in ((a, 5 if homes["s1"] == "a" else 0), (b, 5 if homes["s1"] == "b" else 0)):
        router.replica_queue_len_cache.update(replica.replica_id, load)
    homes["s2"] = await route(router, session("s2", 0))
    assert homes["s1"] != homes["s2"]
    for replica in (a, b):
        router.replica_queue_len_cache.update(replica.replica_id, 0)
    metadata = RequestMetadata(request_id="r", internal_request_id="shared")
    pending = {name: PendingRequest(args=[session(name, 1)], kwargs={}, metadata=metadata) for name in homes}
    chosen = {name: (await router.choose_replicas(router._replicas_list, p))[0][0] for name, p in pending.items()}
    assert {name: r.replica_id.unique_id for name, r in chosen.items()} == homes
    router.on_request_completed(chosen["s1"].replica_id, "shared")  # neither sent yet: both choices kept
    for name, p in pending.items():
        router.on_request_routed(p, chosen[name].replica_id, None)  # type: ignore[arg-type]
    assert await route(router, session("s2", 2)) == homes["s2"]
    assert router._picked == {}


async def test_two_calls_of_one_request_both_get_a_replica_through_serves_own_routing():
    """Serve's routing loop matches a chosen replica to its request by `internal_request_id`: two
    decoder calls sharing it (a legacy completion's two prompts) must both be sent, each where its own
    prompt was routed, not wait forever (the second was never matched)."""
    a, b = FakeReplica("a"), FakeReplica("b")
    router = await started(a, b)
    metadata = RequestMetadata(request_id="r", internal_request_id="shared")
    calls = [PendingRequest(args=[session(name, 0)], kwargs={}, metadata=metadata) for name in ("s1", "s2")]
    async with asyncio.timeout(10):
        replicas = await asyncio.gather(*(router._choose_replica_for_request(call) for call in calls))
    assert {r.replica_id.unique_id for r in replicas} <= {"a", "b"}
    assert all(call.future.done() for call in calls)

"""`Budget`: units reserved per request, waiting in arrival order, cancellable, released early on demand.
`Sequences`: a decoder's sequences, background work (batch lines) on idle capacity only. Both queue
tenants (API keys) fairly, and cap a tenant to its share."""

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from deployments.engines.admission import Budget, Sequences
from deployments.protocol.replica import BACKGROUND_PRIORITY


async def hold(room: Budget, need: int, started: list[int], release: asyncio.Event, name: int) -> None:
    async with room.reserve(need):
        started.append(name)
        await release.wait()


async def test_requests_that_do_not_fit_wait_in_arrival_order():
    room, started, release = Budget(100), [], asyncio.Event()
    tasks = [asyncio.create_task(hold(room, n, started, release, i)) for i, n in enumerate([60, 50, 10, 30])]
    await asyncio.sleep(0.01)
    assert started == [0] and room.waiting == 3 and room.reserved == 60  # 10 would fit, but 50 came first
    release.set()
    await asyncio.gather(*tasks)
    assert started == [0, 1, 2, 3] and room.reserved == 0 and room.waiting == 0


async def test_a_cancelled_waiter_leaves_the_queue_and_lets_the_next_in():
    room, started, release = Budget(100), [], asyncio.Event()
    first = asyncio.create_task(hold(room, 80, started, release, 0))
    big = asyncio.create_task(hold(room, 90, started, release, 1))
    small = asyncio.create_task(hold(room, 20, started, release, 2))
    await asyncio.sleep(0.01)
    assert started == [0] and room.waiting == 2
    big.cancel()
    await asyncio.sleep(0.01)
    assert started == [0, 2] and room.reserved == 100 and room.waiting == 0
    release.set()
    await asyncio.gather(first, small)
    with pytest.raises(asyncio.CancelledError):
        await big
    assert room.reserved == 0


async def test_a_request_larger_than_the_budget_is_held_to_the_budget():
    room = Budget(100)
    async with room.reserve(500):
        assert room.reserved == 100
    assert room.reserved == 0


async def test_an_early_release_lets_the_next_in_while_the_block_goes_on():
    budget, order = Budget(100), []

    async def prefill(name: str, need: int, first_token: asyncio.Event, done: asyncio.Event) -> None:
        async with budget.reserve(need) as release:
            order.append(f"{name} in")
            await first_token.wait()
            release()
            release()  # a second call changes nothing
            await done.wait()
        order.append(f"{name} out")

    first_token, done = asyncio.Event(), asyncio.Event()
    a = asyncio.create_task(prefill("a", 80, first_token, done))
    b = asyncio.create_task(prefill("b", 80, asyncio.Event(), asyncio.Event()))
    await asyncio.sleep(0.01)
    assert order == ["a in"] and budget.waiting == 1
    first_token.set()  # a's prompt is done: b's may start while a still decodes
    await asyncio.sleep(0.01)
    assert order == ["a in", "b in"] and budget.reserved == 80
    done.set()
    await a
    assert order[-1] == "a out" and budget.reserved == 80  # b's share only: a gave its own back once
    b.cancel()
    with pytest.raises(asyncio.CancelledError):
        await b
    assert budget.reserved == 0


async def test_waiters_are_granted_by_priority_then_in_arrival_order():
    room, started, release = Budget(1), [], asyncio.Event()

    async def hold_with(name: int, priority: int) -> None:
        async with room.reserve(1, priority):
            started.append(name)
            await release.wait()
            release.clear()

    first = asyncio.create_task(hold_with(0, 0))
    await asyncio.sleep(0.01)
    waiting = [asyncio.create_task(hold_with(n, p)) for n, p in [(1, 0), (2, 5), (3, -2), (4, 0)]]
    await asyncio.sleep(0.01)
    assert room.waiting == 4
    for _ in range(5):
        release.set()
        await asyncio.sleep(0.01)
    await asyncio.gather(first, *waiting)
    assert started == [0, 3, 1, 4, 2]


async def test_a_waiter_of_a_better_priority_that_fits_goes_past_the_queue():
    room, started, release = Budget(100), [], asyncio.Event()
    tasks = [asyncio.create_task(hold(room, n, started, release, i)) for i, n in enumerate([60, 50])]
    await asyncio.sleep(0.01)

    async def urgent() -> None:
        async with room.reserve(30, priority=-1):
            started.append(9)

    await urgent()
    assert started == [0, 9]
    release.set()
    await asyncio.gather(*tasks)


async def run_in(seqs: Sequences, priority: int, started: list[str], name: str, done: asyncio.Event) -> None:
    async with seqs.reserve(1, priority):
        started.append(name)
        await done.wait()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_background_work_yields_to_foreground_work_until_the_replica_is_quiet():
    seqs, started = Sequences(8, quiet_s=1.0, busy_share=1), []
    chat_done, lines_done = asyncio.Event(), asyncio.Event()
    alone = [asyncio.create_task(run_in(seqs, BACKGROUND_PRIORITY, started, f"early{i}", lines_done)) for i in range(2)]
    await settle()
    assert started == ["early0", "early1"]  # an idle replica: background work takes what it leaves
    lines_done.set()
    await asyncio.gather(*alone)
    lines_done.clear()

    chat = asyncio.create_task(run_in(seqs, 0, started, "chat", chat_done))
    await settle()
    lines = [
        asyncio.create_task(run_in(seqs, BACKGROUND_PRIORITY + 2 - i, started, f"line{i}", lines_done))
        for i in range(3)
    ]
    await settle()
    assert started[2:] == ["chat", "line0"] and seqs.waiting == 2  # beside a chat: `busy_share` lines at most
    left = asyncio.get_running_loop().time()  # at most when the chat left
    chat_done.set()
    await chat
    await settle()
    assert seqs.waiting == 2  # not before the replica has been quiet for `quiet_s`
    for _ in range(500):
        if not seqs.waiting:
            break
        await asyncio.sleep(0.01)
    assert asyncio.get_running_loop().time() - left >= seqs.quiet_s
    await settle()  # granted lines append themselves when their tasks next run
    assert started[4:] == ["line2", "line1"]  # the earlier priority first
    lines_done.set()
    await asyncio.gather(*lines)
    assert (seqs.foreground, seqs.background, seqs.reserved) == (0, 0, 0)


async def test_a_background_request_waiting_for_room_is_held_back_once_a_chat_arrives():
    """Lines that started on a quiet replica fill it; one more waits for a sequence. A chat arrives
    and takes the first one freed; the next one freed stays free while a line still runs beside the
    chat (`busy_share` 1); the waiting line starts once it is the only one."""
    seqs, started = Sequences(3, quiet_s=10, busy_share=1), []
    done = {name: asyncio.Event() for name in ("bg0", "bg1", "bg2", "bg3", "chat")}
    tasks = {
        name: asyncio.create_task(run_in(seqs, BACKGROUND_PRIORITY, started, name, done[name]))
        for name in ("bg0", "bg1", "bg2", "bg3")
    }
    await settle()
    tasks["chat"] = asyncio.create_task(run_in(seqs, 0, started, "chat", done["chat"]))
    await settle()
    assert started == ["bg0", "bg1", "bg2"] and seqs.waiting == 2

    async def finish(name: str) -> None:
        done[name].set()
        await tasks[name]
        await settle()

    await finish("bg0")
    assert started[3:] == ["chat"]  # the chat goes first
    await finish("bg1")
    assert started[3:] == ["chat"] and seqs.waiting == 1  # bg2 still runs beside the chat: bg3 waits
    await finish("bg2")
    assert started[3:] == ["chat", "bg3"]  # the one line beside the chat
    tasks["late"] = asyncio.create_task(run_in(seqs, BACKGROUND_PRIORITY, started, "late", done["chat"]))
    await settle()
    assert seqs.waiting == 1
    tasks["late"].cancel()  # a waiting line can be cancelled
    with pytest.raises(asyncio.CancelledError):
        await tasks.pop("late")
    for name in ("bg3", "chat"):
        await finish(name)
    assert (seqs.foreground, seqs.background, seqs.reserved, seqs.waiting) == (0, 0, 0, 0)


async def holds(
    budget: Budget, tenant: str, name: str, started: list[str], done: asyncio.Event, share: float | None = None
) -> None:
    """One unit of `tenant`'s, held until the round that `done` ends (`_drain`)."""
    async with budget.reserve(1, tenant=tenant, share=share):
        started.append(name)
        await done.wait()
        done.clear()


async def test_a_tenant_with_one_waiter_is_served_next_to_a_tenant_with_many():
    seqs, started, done = Sequences(2, headroom=0), [], asyncio.Event()  # fair queueing alone

    def run(tenant: str, name: str) -> Coroutine[Any, Any, None]:
        return holds(seqs, tenant, name, started, done)

    flood = [asyncio.create_task(run("a", f"a{i}")) for i in range(8)]
    await settle()
    lone = asyncio.create_task(run("b", "b0"))
    await settle()
    assert started == ["a0", "a1"] and seqs.waiting == 7
    await _drain([*flood, lone], done)
    assert started.index("b0") <= 3  # beside a's first waiter, not behind its six
    assert [n for n in started if n.startswith("a")] == [f"a{i}" for i in range(8)]  # a's own order kept


async def test_a_tenant_capped_to_a_share_leaves_the_rest_to_others_and_waits_beyond_it():
    seqs, started, done = Sequences(4, headroom=0), [], asyncio.Event()  # the cap alone

    def run(tenant: str, name: str, share: float | None) -> Coroutine[Any, Any, None]:
        return holds(seqs, tenant, name, started, done, share)

    capped = [asyncio.create_task(run("a", f"a{i}", 0.5)) for i in range(4)]
    await settle()
    assert started == ["a0", "a1"] and seqs.reserved == 2  # half of 4: two sequences
    others = [asyncio.create_task(run("b", f"b{i}", None)) for i in range(2)]
    await settle()
    assert started == ["a0", "a1", "b0", "b1"]  # b passes a's capped waiters
    await _drain([*capped, *others], done)
    assert seqs.reserved == 0 and seqs.waiting == 0


async def test_a_tenant_served_alone_before_neither_jumps_the_queue_nor_waits_behind_it():
    budget, started, done = Budget(1), [], asyncio.Event()

    def run(tenant: str, name: str) -> Coroutine[Any, Any, None]:
        return holds(budget, tenant, name, started, done)

    for i in range(3):  # b alone, served at once each time: no credit saved for later
        await asyncio.gather(asyncio.create_task(run("b", f"b{i}")), _set_soon(done))
    first = [asyncio.create_task(run("a", f"a{i}")) for i in range(3)]
    await settle()
    late = asyncio.create_task(run("b", "b3"))
    await settle()
    await _drain([*first, late], done)
    assert started[3:] == ["a0", "a1", "b3", "a2"]  # b3 among a's waiters: no credit saved, no penalty kept


async def test_a_key_beside_another_keys_flood_gets_a_sequence_at_once_and_a_key_alone_all_but_one():
    """Fair share by default (no share set): A, of an earlier priority even, asks for 3x the
    sequences; it gets all but one, and B's first request takes that one at once, before any of A's
    ends. Once B is gone the headroom stays free: the cost, A alone runs `size - 1`. An explicit
    share replaces the headroom (1.0: every sequence), and without limits (no tenant) nothing is
    held back."""
    seqs, started, done = Sequences(4), [], asyncio.Event()

    async def run(tenant: str, name: str, priority: int = 0, share: float | None = None) -> None:
        async with seqs.reserve(1, priority, tenant, share):
            started.append(name)
            await done.wait()

    flood = [asyncio.create_task(run("a", f"a{i}", priority=-1)) for i in range(12)]
    await settle()
    assert started == ["a0", "a1", "a2"] and seqs.reserved == 3 and seqs.waiting == 9
    b = asyncio.create_task(run("b", "b0"))
    await settle()
    assert started[3:] == ["b0"] and seqs.reserved == 4  # no release of A's needed
    c = asyncio.create_task(run("c", "c0"))
    await settle()
    assert "c0" not in started and seqs.waiting == 10  # the headroom is one sequence: C waits
    done.set()
    await asyncio.gather(*flood, b, c)
    assert started[4] == "c0"  # then the first sequence freed: C holds none, A's waiters are held back

    done.clear()
    for tenant, share, alone in (("a", None, 3), ("a", 1.0, 4), ("", None, 4)):
        started.clear()
        tasks = [asyncio.create_task(run(tenant, f"x{i}", share=share)) for i in range(6)]
        await settle()
        assert len(started) == alone, (tenant, share)
        done.set()
        await asyncio.gather(*tasks)
        done.clear()
    assert (seqs.reserved, seqs.waiting, seqs.foreground) == (0, 0, 0)


async def test_kv_cells_held_back_for_a_newcomer_whose_request_passes_a_waiter_that_does_not_fit():
    """The KV-cell budget holds a slot's worth back: A's requests of 300 cells stop at 600 of 1,000
    (a third would leave under 250 free), B's first of 300 enters at once, A's own later small one
    does not jump A's waiting one, and a newcomer that does not fit waits like anyone."""
    room, started, done = Budget(1000, headroom=250), [], asyncio.Event()

    async def run(tenant: str, name: str, need: int) -> None:
        async with room.reserve(need, tenant=tenant):
            started.append(name)
            await done.wait()

    a = [asyncio.create_task(run("a", f"a{i}", need)) for i, need in enumerate([300, 300, 300, 50])]
    await settle()
    assert started == ["a0", "a1"] and room.reserved == 600  # a3 (50) would fit, but a2 came first
    b = asyncio.create_task(run("b", "b0", 300))
    await settle()
    assert started[2:] == ["b0"] and room.reserved == 900
    c = asyncio.create_task(run("c", "c0", 200))
    await settle()
    assert "c0" not in started and room.waiting == 3  # 100 left: the newcomer waits for a release
    done.set()
    await asyncio.gather(*a, b, c)
    assert room.reserved == 0 and started.index("c0") < started.index("a2")


async def test_a_keys_batch_lines_leave_a_sequence_for_another_keys_chat():
    """On a quiet replica A's batch lines take all but one sequence; B's chat takes it at once, and
    B's batch lines still wait while a chat is on the replica."""
    seqs, started = Sequences(4, quiet_s=0.01), []
    lines_done, chat_done = asyncio.Event(), asyncio.Event()

    async def run(tenant: str, name: str, priority: int, done: asyncio.Event) -> None:
        async with seqs.reserve(1, priority, tenant):
            started.append(name)
            await done.wait()

    lines = [asyncio.create_task(run("a", f"line{i}", BACKGROUND_PRIORITY, lines_done)) for i in range(6)]
    await settle()
    assert started == ["line0", "line1", "line2"]
    chat = asyncio.create_task(run("b", "chat", 0, chat_done))
    other = asyncio.create_task(run("c", "c-line", BACKGROUND_PRIORITY, lines_done))
    await settle()
    assert started[3:] == ["chat"] and seqs.waiting == 4
    chat_done.set()
    lines_done.set()
    await asyncio.gather(chat, *lines, other)
    assert (seqs.reserved, seqs.background, seqs.foreground) == (0, 0, 0)


async def _drain(tasks: list[asyncio.Task], done: asyncio.Event) -> None:
    """Let the running holders end, one round at a time, until every task has."""
    while not all(task.done() for task in tasks):
        done.set()
        await settle()
    await asyncio.gather(*tasks)


async def _set_soon(event: asyncio.Event) -> None:
    await settle()
    event.set()

"""`Budget`: units reserved per request, waiting in arrival order, cancellable, released early on demand."""

import asyncio

import pytest

from deployments.engines.admission import Budget


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

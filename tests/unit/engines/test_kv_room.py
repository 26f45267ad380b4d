"""`KvRoom`: cells reserved per request, waiting in arrival order, cancellable."""

import asyncio

import pytest

from deployments.engines.llamacpp.kv_room import KvRoom


async def hold(room: KvRoom, need: int, started: list[int], release: asyncio.Event, name: int) -> None:
    async with room.reserve(need):
        started.append(name)
        await release.wait()


async def test_requests_that_do_not_fit_wait_in_arrival_order():
    room, started, release = KvRoom(100), [], asyncio.Event()
    tasks = [asyncio.create_task(hold(room, n, started, release, i)) for i, n in enumerate([60, 50, 10, 30])]
    await asyncio.sleep(0.01)
    assert started == [0] and room.waiting == 3 and room.reserved == 60  # 10 would fit, but 50 came first
    release.set()
    await asyncio.gather(*tasks)
    assert started == [0, 1, 2, 3] and room.reserved == 0 and room.waiting == 0


async def test_a_cancelled_waiter_leaves_the_queue_and_lets_the_next_in():
    room, started, release = KvRoom(100), [], asyncio.Event()
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


async def test_a_request_larger_than_the_pool_is_held_to_the_pool():
    room = KvRoom(100)
    async with room.reserve(500):
        assert room.reserved == 100
    assert room.reserved == 0

"""The captioner's batcher: batches form when the model is free, never while it runs."""

import asyncio

import pytest

from deployments.engines.batcher import Batcher


class Model:
    """A batch function that records batch sizes and, while `hold` is set, blocks until released."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()
        self.hold = True

    async def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(items)
        if self.hold:
            await self.release.wait()
        if -1 in items:
            raise ValueError("bad item")
        return [i * 10 for i in items]


async def until(predicate) -> None:
    while not predicate():
        await asyncio.sleep(0.005)


async def test_items_arriving_while_a_batch_runs_go_together_in_the_next():
    model = Model()
    batcher = Batcher(model, max_batch_size=4, wait_s=0.01)
    first = asyncio.create_task(batcher.submit(1))
    await until(lambda: model.batches)
    later = [asyncio.create_task(batcher.submit(i)) for i in range(2, 8)]
    await asyncio.sleep(0.1)  # ten wait_s periods: no batch may form while the model is busy
    assert model.batches == [[1]]
    model.hold = False
    model.release.set()
    assert await first == 10
    assert await asyncio.gather(*later) == [20, 30, 40, 50, 60, 70]
    assert model.batches == [[1], [2, 3, 4, 5], [6, 7]]


async def test_an_idle_model_waits_for_company_up_to_a_full_batch():
    model = Model()
    model.hold = False
    batcher = Batcher(model, max_batch_size=3, wait_s=30)  # a full batch starts without waiting
    assert await asyncio.gather(*(batcher.submit(i) for i in (1, 2, 3))) == [10, 20, 30]
    batcher.wait_s = 0.02
    assert await asyncio.gather(*(batcher.submit(i) for i in (4, 5))) == [40, 50]
    assert model.batches == [[1, 2, 3], [4, 5]]


async def test_an_error_reaches_every_caller_in_its_batch_and_the_next_batch_runs():
    model = Model()
    model.hold = False
    batcher = Batcher(model, max_batch_size=4, wait_s=0.02)
    results = await asyncio.gather(batcher.submit(-1), batcher.submit(2), return_exceptions=True)
    assert all(isinstance(r, ValueError) for r in results)
    assert await batcher.submit(3) == 30


async def test_a_wrong_number_of_results_is_an_error_not_a_mismatch():
    async def short(items: list[int]) -> list[int]:
        return items[:1]

    batcher = Batcher(short, max_batch_size=4, wait_s=0.02)
    with pytest.raises(RuntimeError, match="returned 1 results"):
        await asyncio.gather(batcher.submit(1), batcher.submit(2))


async def test_a_cancelled_callers_item_is_dropped_before_its_batch_runs():
    model = Model()
    batcher = Batcher(model, max_batch_size=4, wait_s=0.01)
    first = asyncio.create_task(batcher.submit(1))
    await until(lambda: model.batches)
    gone, kept = asyncio.create_task(batcher.submit(2)), asyncio.create_task(batcher.submit(3))
    await asyncio.sleep(0.01)
    gone.cancel()
    model.hold = False
    model.release.set()
    assert (await first, await kept) == (10, 30)
    assert model.batches == [[1], [3]]

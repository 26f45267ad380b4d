"""Stored responses on the storage root (`deployments.state.responses`): found again by a new store
on the same root (a restart, another replica), bounded by bytes (oldest first out) and by age,
each its owner's, with a shelf that a crash cannot leave wrong for long."""

from __future__ import annotations

import asyncio

from deployments.state.owners import Caller
from deployments.state.records import stored_owners
from deployments.state.responses import SETTLING_S, SHELF, StoredResponses
from deployments.state.storage import LocalStorage

ALICE, BOB, ANYONE = Caller(b"a" * 32), Caller(b"b" * 32), Caller()


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def store(root, max_bytes: int = 1 << 20, max_age_s: float = 3600.0, clock: Clock | None = None) -> StoredResponses:
    storage = LocalStorage(str(root))
    return StoredResponses(storage, stored_owners(storage), max_bytes, max_age_s, clock or Clock())


def entry(rid: str, text: str = "hello") -> dict:
    return {"response": {"id": rid, "output": [{"type": "message", "content": [{"text": text}]}]}, "input": []}


async def test_a_response_is_found_by_a_new_store_on_the_same_root(tmp_path):
    await store(tmp_path).put("resp_1", entry("resp_1"), ALICE)
    again = store(tmp_path)  # a restarted replica, or another one
    assert (await again.get("resp_1", ALICE)).thing == entry("resp_1")
    other = await again.get("resp_1", BOB)
    assert other.thing is None and other.foreign
    assert (await again.get("resp_1", ANYONE)).thing is None
    assert (await again.delete("resp_1", BOB)).thing is None
    assert (await again.delete("resp_1", ALICE)).thing is not None
    assert (await store(tmp_path).get("resp_1", ALICE)).thing is None
    assert again.size() == (0, 0)


async def test_the_oldest_go_first_past_the_byte_bound(tmp_path):
    clock = Clock()
    sized = store(tmp_path / "sized", clock=clock)
    sized.save("resp_0", entry("resp_0", "x" * 1000), ANYONE)
    one = sized.size()[1]
    bounded = store(tmp_path / "bounded", max_bytes=3 * one + one // 2, clock=clock)
    for i in range(6):
        clock.now += 1
        bounded.save(f"resp_{i}", entry(f"resp_{i}", "x" * 1000), ANYONE)
    assert bounded.sweep() == 0  # all younger than SETTLING_S: a save may still be writing its record
    clock.now += SETTLING_S
    assert bounded.sweep() == 3
    assert [(await bounded.get(f"resp_{i}", ANYONE)).thing is not None for i in range(6)] == [False] * 3 + [True] * 3
    count, total = bounded.size()
    assert count == 3 and total <= 3 * one + one // 2


async def test_a_put_past_an_eighth_of_the_bound_sweeps_without_the_request_waiting(tmp_path):
    clock = Clock()
    bounded = store(tmp_path, max_bytes=8_000, clock=clock)
    bounded.sweep()  # swept just now: the next sweep is due by bytes, not by time
    for i in range(40):
        clock.now += 1
        await bounded.put(f"resp_{i}", entry(f"resp_{i}", "y" * 400), ANYONE)
        await asyncio.sleep(0)
    if bounded._sweeping is not None:
        await bounded._sweeping
    bounded.sweep()
    assert bounded.size()[1] <= 8_000
    assert (await bounded.get("resp_39", ANYONE)).thing is not None
    assert (await bounded.get("resp_0", ANYONE)).thing is None


async def test_past_its_age_a_response_is_not_found_swept_or_not(tmp_path):
    clock = Clock()
    aged = store(tmp_path, max_age_s=60, clock=clock)
    aged.save("resp_old", entry("resp_old"), ALICE)
    clock.now += 30
    aged.save("resp_new", entry("resp_new"), ALICE)
    clock.now += 31
    assert (await aged.get("resp_old", ALICE)).thing is None  # removed as it is reached
    assert aged.size()[0] == 1
    clock.now += 30
    assert aged.sweep() == 1
    assert aged.size() == (0, 0)


async def test_zero_bytes_keeps_none(tmp_path):
    none = store(tmp_path, max_bytes=0)
    await none.put("resp_1", entry("resp_1"), ANYONE)
    assert (await none.get("resp_1", ANYONE)).thing is None


def test_a_marker_without_its_record_is_swept_and_a_foreign_name_ignored(tmp_path):
    clock = Clock()
    crashed = store(tmp_path, max_bytes=10, max_age_s=60, clock=clock)
    crashed.save("resp_1", entry("resp_1"), ANYONE)
    crashed.storage.delete("responses/resp_1.json")  # the record gone, its marker left (a crash between)
    crashed.storage.write(f"{SHELF}/notes", b"")
    clock.now += 61
    crashed.sweep()
    assert crashed.storage.names(SHELF) == []


async def test_an_id_that_is_not_ours_is_never_a_path(tmp_path):
    kept = store(tmp_path)
    for rid in ("../owners.secret", "resp_1/../../x", "a\0b", ""):
        assert (await kept.get(rid, ANYONE)).thing is None


async def test_a_failed_background_sweep_is_said_and_puts_go_on(tmp_path, caplog):
    kept = store(tmp_path, max_bytes=8)

    def broken(directory: str) -> list[str]:
        raise OSError("the disk went away")

    kept.storage.names = broken  # type: ignore[method-assign]
    await kept.put("resp_1", entry("resp_1"), ANYONE)  # past an eighth of the bound: a sweep is started
    assert kept._sweeping is not None and await kept._sweeping == 0
    assert "the sweep failed" in caplog.text and "the disk went away" in caplog.text
    await kept.put("resp_2", entry("resp_2"), ANYONE)
    assert (await kept.get("resp_2", ANYONE)).thing is not None

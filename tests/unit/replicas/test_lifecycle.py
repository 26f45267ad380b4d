import time

import pytest

from deployments.config import Lifecycle
from deployments.engines import Engine
from deployments.errors import CaptionerUnavailable
from deployments.replicas.lifecycle import EngineSlot


class Factory:
    def __init__(self, fail_times: int) -> None:
        self.fail_times, self.calls, self.closed = fail_times, 0, 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.fail_times:
            raise MemoryError("CUDA out of memory (simulated)")
        factory = self

        class Closing(Engine):
            def close(self):
                factory.closed += 1

        return Closing()


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


async def test_failed_load_is_reported_and_retried():
    factory = Factory(fail_times=1)
    slot = EngineSlot(
        "captioner", "cap", factory, unavailable=CaptionerUnavailable, lifecycle=Lifecycle(load_retry_s=0.2)
    )
    assert slot.load() is False
    status = slot.status()
    assert not status.ready and "CUDA out of memory" in status.reason
    with pytest.raises(CaptionerUnavailable, match="CUDA out of memory"):
        async with slot.use():
            pass
    slot.start(tick_s=0.05)
    try:
        assert wait_for(lambda: slot.status().ready)
        async with slot.use() as engine:
            assert engine is slot.engine
    finally:
        slot.stop()


async def test_idle_engine_is_unloaded_and_reloaded_on_use():
    factory = Factory(fail_times=0)
    slot = EngineSlot(
        "decoder", "llm", factory, unavailable=CaptionerUnavailable, lifecycle=Lifecycle(idle_unload_s=0.2)
    )
    assert slot.load()
    slot.start(tick_s=0.05)
    try:
        assert wait_for(lambda: slot.state == "unloaded")
        assert factory.closed == 1 and slot.status().ready  # unloaded is not a failure
        async with slot.use() as engine:
            assert engine is not None and factory.calls == 2
    finally:
        slot.stop()


async def test_engine_in_use_is_not_unloaded():
    factory = Factory(fail_times=0)
    slot = EngineSlot(
        "decoder", "llm", factory, unavailable=CaptionerUnavailable, lifecycle=Lifecycle(idle_unload_s=0.1)
    )
    slot.load()
    slot.start(tick_s=0.02)
    try:
        async with slot.use():
            time.sleep(0.4)
            assert slot.state == "ready"
    finally:
        slot.stop()

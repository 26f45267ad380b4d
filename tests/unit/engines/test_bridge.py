"""`ThreadStream`, the thread-to-event-loop bridge of the engines: items arrive in order, the
producer's exception is raised after what it sent before, and closing the consumer stops the
producer."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest

from deployments.engines.bridge import ThreadStream


def start(stream: ThreadStream, produce) -> threading.Thread:
    thread = threading.Thread(target=stream.run, args=(produce,), daemon=True)
    thread.start()
    return thread


async def test_items_arrive_in_order_then_the_iteration_ends():
    with ThreadStream[int]() as stream:
        thread = start(stream, lambda: [stream.send(i) for i in range(100)])
        assert [item async for item in stream] == list(range(100))
        assert [item async for item in stream] == []  # ended stays ended
    thread.join(5)
    assert not thread.is_alive()


async def test_the_producers_exception_is_raised_after_the_items_before_it_mapped_by_error():
    def produce() -> None:
        stream.send("a")
        stream.send("b")
        raise KeyError("boom")

    stream = ThreadStream[str](lambda exc: ValueError(f"mapped {exc}"))
    seen = []
    with stream, pytest.raises(ValueError, match="mapped 'boom'"):
        start(stream, produce)
        async for item in stream:
            seen.append(item)
    assert seen == ["a", "b"]


async def test_without_a_mapping_the_exception_itself_is_raised():
    stream = ThreadStream[int]()
    error = RuntimeError("as it is")
    with stream, pytest.raises(RuntimeError) as raised:
        start(stream, lambda: stream.fail(error))
        async for _ in stream:
            pass
    assert raised.value is error


async def test_closing_the_consumer_stops_the_producer():
    produced = []

    async def consumer() -> AsyncIterator[int]:
        with ThreadStream[int]() as stream:

            def produce() -> None:
                i = 0
                while not stream.cancelled.is_set():
                    stream.send(i)
                    produced.append(i)
                    i += 1
                    stream.cancelled.wait(0.001)

            threads.append(start(stream, produce))
            async for item in stream:
                yield item

    threads: list[threading.Thread] = []
    items = consumer()
    assert [await anext(items) for _ in range(3)] == [0, 1, 2]
    await items.aclose()
    threads[0].join(5)
    assert not threads[0].is_alive()  # it saw `cancelled` and returned
    count = len(produced)
    await asyncio.sleep(0.02)
    assert len(produced) == count


async def test_a_cancelled_consumer_task_stops_the_producer():
    stream_box: list[ThreadStream[int]] = []

    async def consume() -> None:
        with ThreadStream[int]() as stream:
            stream_box.append(stream)
            async for _ in stream:  # nothing comes
                pass

    task = asyncio.ensure_future(consume())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stream_box[0].cancelled.is_set()


def test_items_sent_after_the_loop_closed_are_dropped():
    loop = asyncio.new_event_loop()

    async def make() -> ThreadStream[int]:
        return ThreadStream[int]()

    stream = loop.run_until_complete(make())
    loop.close()
    ran: list[str] = []
    stream.send(1)  # no error: nobody listens any more
    stream.run(lambda: ran.append("produced"))  # its body still runs; its failure and end are dropped too
    assert ran == ["produced"]
    assert stream._queue.empty()  # nothing was queued for a loop that is gone

"""Batch lines bounded and failing alone, without Ray: the line reader (linear, a per-line cap that
never holds a longer line), lines that cannot be parsed (nested too deeply) or are over the cap failing
with their own code at validation and while running, a batch whose job keeps failing ending `failed`
with its reason, cancel ending such a batch (failing or stuck), and the event loop running while an
input file is read."""

from __future__ import annotations

import asyncio
import json
import threading
import tracemalloc
from typing import Any

from deployments.batch_runner import runner as runner_module
from deployments.batch_runner.input_lines import LongLine, lines
from deployments.batch_runner.progress import resume
from deployments.batch_runner.runner import BatchRuntime
from deployments.batch_runner.validation import validate
from deployments.state import storage as storage_module
from deployments.state.files import data_path, new_file_id
from deployments.state.storage import LocalStorage
from tests.unit.ingress.test_batches import (
    ALICE,
    CHAT,
    SERVED,
    FakeIngress,
    chat_line,
    config,
    jsonl,
    settled,
    submit,
    written,
)

DEEP_LIST = b"[" * 5000 + b"]" * 5000
DEEP_OBJECT = b'{"a":' * 5000 + b"1" + b"}" * 5000


def test_lines_span_many_chunks_and_a_line_over_the_cap_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(storage_module, "CHUNK_BYTES", 7)
    storage = LocalStorage(str(tmp_path))
    long = b"x" * 1000
    storage.write("f.jsonl", b"a\n\n  \nbb\r\n" + long + b"\nccc\n" + long + b"y")
    assert list(lines(storage, "f.jsonl")) == [(1, b"a"), (4, b"bb"), (5, long), (6, b"ccc"), (7, long + b"y")]
    assert list(lines(storage, "f.jsonl", 1000)) == [
        (1, b"a"),
        (4, b"bb"),
        (5, long),
        (6, b"ccc"),
        (7, LongLine(1001, 1000)),
    ]
    assert list(lines(storage, "f.jsonl", 3)) == [
        (1, b"a"),
        (4, b"bb"),
        (5, LongLine(1000, 3)),
        (6, b"ccc"),
        (7, LongLine(1001, 3)),
    ]


def test_a_line_over_the_cap_is_never_held_whole(tmp_path):
    storage = LocalStorage(str(tmp_path))
    storage.write("big.jsonl", b"short\n" + b"x" * 8_000_000 + b"\nlast\n")
    tracemalloc.start()
    got = list(lines(storage, "big.jsonl", 1000))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert got == [(1, b"short"), (2, LongLine(8_000_000, 1000)), (3, b"last")]
    assert peak < 1_000_000, peak  # a chunk or two, not the 8 MB line


def test_validation_fails_each_unparseable_or_long_line_alone_with_its_code():
    good = json.dumps(chat_line("a")).encode()
    found = validate(
        [(1, good), (2, DEEP_LIST), (3, DEEP_OBJECT), (4, b"1" * 5000), (5, LongLine(40_000_000, 33_554_432))],
        CHAT,
        SERVED,
        10,
        10,
    )
    assert found.total == 5
    assert [(e.line, e.code) for e in found.errors] == [
        (2, "invalid_json_line"),
        (3, "invalid_json_line"),
        (4, "invalid_json_line"),
        (5, "line_too_large"),
    ]
    assert "nests too deeply" in found.errors[0].message and "40000000 bytes" in found.errors[3].message


async def test_a_batch_with_a_deep_or_long_line_fails_validation_naming_it(tmp_path):
    fake = FakeIngress()
    runtime = BatchRuntime(config(tmp_path).model_copy(update={"max_line_bytes": 40_000}), fake.send)
    long = json.dumps(chat_line("long", "x" * 50_000)).encode()
    batch_id = submit(runtime, jsonl([chat_line("a"), DEEP_LIST, long, chat_line("b")]))
    batch = await settled(runtime, batch_id)
    assert batch["status"] == "failed" and fake.sent == []
    assert [(e["line"], e["code"]) for e in batch["errors"]["data"]] == [
        (2, "invalid_json_line"),
        (3, "line_too_large"),
    ]


async def test_lines_unreadable_while_running_fail_alone_and_the_others_run(tmp_path):
    """A batch validated by an older version (or under a larger cap): its unreadable lines are error
    lines with their numbers, the others answered, and a resume skips them all."""
    fake = FakeIngress()
    runtime = BatchRuntime(config(tmp_path).model_copy(update={"max_line_bytes": 40_000}), fake.send)
    long = json.dumps(chat_line("long", "x" * 50_000)).encode()
    batch_id = submit(runtime, jsonl([chat_line("a", "one"), DEEP_OBJECT, long, chat_line("b", "two")]))
    record = runtime.batches.records.load(batch_id)
    assert record is not None
    record["object"].update(status="in_progress", request_counts={"total": 4, "completed": 0, "failed": 0})
    record["files"] = {"output": new_file_id(), "error": new_file_id()}
    runtime.batches.records.save(batch_id, record)

    batch = await settled(runtime, batch_id)
    assert batch["status"] == "completed", batch
    assert batch["request_counts"] == {"total": 4, "completed": 2, "failed": 2}
    assert sorted(fake.sent) == ["one", "two"]
    errors = written(runtime, batch["error_file_id"])
    assert [(e["custom_id"], e["response"], e["error"]["line"], e["error"]["code"]) for e in errors] == [
        (None, None, 2, "invalid_json_line"),
        (None, None, 3, "line_too_large"),
    ]
    progress = resume(runtime.batches.storage, data_path(record["files"]["output"]), data_path(batch["error_file_id"]))
    assert (progress.done, progress.unreadable, progress.failed) == ({"a", "b"}, {2, 3}, 2)


def failing_input(runtime: BatchRuntime, monkeypatch: Any, batch_id: str) -> list[str]:
    """Reading the batch's input file raises (the storage root failing); the reads tried."""
    source = data_path(runtime.batches.retrieve(batch_id, ALICE)["input_file_id"])
    storage, chunks, tries = runtime.batches.storage, runtime.batches.storage.chunks, []

    def failing(path: str) -> Any:
        if path == source:
            tries.append(path)
            raise OSError("the storage root went away")
        return chunks(path)

    monkeypatch.setattr(storage, "chunks", failing)
    return tries


async def test_a_batch_whose_job_keeps_failing_ends_failed_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(runner_module, "RETRY_BASE_S", 0.0)
    runtime = BatchRuntime(config(tmp_path), FakeIngress().send)
    batch_id = submit(runtime, jsonl([chat_line("a")]))
    tries = failing_input(runtime, monkeypatch, batch_id)
    batch = await settled(runtime, batch_id, timeout_s=10)
    assert batch["status"] == "failed" and batch["failed_at"]
    [error] = batch["errors"]["data"]
    assert error["code"] == "runner_failed" and "OSError" in error["message"]
    assert len(tries) == runner_module.JOB_TRIES


async def test_cancel_ends_a_batch_whose_job_keeps_failing(tmp_path, monkeypatch):
    monkeypatch.setattr(runner_module, "RETRY_BASE_S", 3600.0)  # its next try would be an hour away
    runtime = BatchRuntime(config(tmp_path), FakeIngress().send)
    batch_id = submit(runtime, jsonl([chat_line("a")]))
    tries = failing_input(runtime, monkeypatch, batch_id)
    loop = asyncio.create_task(runtime.loop())
    async with asyncio.timeout(10):
        while not tries or batch_id in runtime._jobs:
            await asyncio.sleep(0.01)
    loop.cancel()
    assert runtime.batches.cancel(batch_id, ALICE)["status"] == "cancelling"
    batch = await settled(runtime, batch_id, timeout_s=10)
    assert batch["status"] == "cancelled" and batch["cancelled_at"] and len(tries) == 1


async def test_cancel_ends_a_batch_whose_job_is_stuck(tmp_path, monkeypatch):
    monkeypatch.setattr(runner_module, "CANCEL_GRACE_S", 0.1)
    runtime = BatchRuntime(config(tmp_path), FakeIngress().send)
    batch_id = submit(runtime, jsonl([chat_line("a")]))
    source = data_path(runtime.batches.retrieve(batch_id, ALICE)["input_file_id"])
    storage, chunks = runtime.batches.storage, runtime.batches.storage.chunks
    reading, release = threading.Event(), threading.Event()

    def stuck(path: str) -> Any:
        if path == source:
            reading.set()
            release.wait(20)  # a hung storage root, in the validating thread
        return chunks(path)

    monkeypatch.setattr(storage, "chunks", stuck)
    loop = asyncio.create_task(runtime.loop())
    try:
        async with asyncio.timeout(10):
            while not reading.is_set():
                await asyncio.sleep(0.01)
        loop.cancel()
        assert runtime.batches.cancel(batch_id, ALICE)["status"] == "cancelling"
        batch = await settled(runtime, batch_id, timeout_s=10)
    finally:
        release.set()
    assert batch["status"] == "cancelled" and batch["output_file_id"] is None


async def test_the_event_loop_runs_while_an_input_file_is_read(tmp_path, monkeypatch):
    """Every chunk of the input file (validation and the run alike) is read while a coroutine on the
    loop goes on ticking: each read waits for a tick that only a free loop can give."""
    monkeypatch.setattr(storage_module, "CHUNK_BYTES", 256)
    fake = FakeIngress()
    runtime = BatchRuntime(config(tmp_path), fake.send)
    batch_id = submit(runtime, jsonl([chat_line(f"r{i}", f"t{i}") for i in range(6)]))
    source = data_path(runtime.batches.retrieve(batch_id, ALICE)["input_file_id"])
    storage, chunks = runtime.batches.storage, runtime.batches.storage.chunks
    ticked, seen = threading.Event(), []

    def watched(path: str) -> Any:
        for chunk in chunks(path):
            if path == source and all(seen):
                ticked.clear()
                seen.append(ticked.wait(5))  # False: the loop was held while this chunk was read
            yield chunk

    async def ticker() -> None:
        while True:
            ticked.set()
            await asyncio.sleep(0.001)

    monkeypatch.setattr(storage, "chunks", watched)
    ticking = asyncio.create_task(ticker())
    try:
        batch = await settled(runtime, batch_id)
    finally:
        ticking.cancel()
    assert batch["status"] == "completed" and len(fake.sent) == 6
    assert len(seen) > 4 and all(seen), seen  # the file read twice (validation, the run), in chunks

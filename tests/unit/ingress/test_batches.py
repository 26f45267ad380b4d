"""The Files and Batch APIs without Ray: the storage root, a batch file's validation, the runner's
loop over a fake `send` (completion, cancel, resume after the runner was killed, expiry), and each
key seeing only its own files and batches."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from starlette.types import Scope

from deployments.batch_runner.input_lines import lines
from deployments.batch_runner.progress import resume
from deployments.batch_runner.runner import BatchRunnerConfig, BatchRuntime
from deployments.batch_runner.validation import ServedNames, validate
from deployments.config import BatchesConfig, ServerConfig
from deployments.errors import InvalidRequestError, ObjectNotFoundError, PayloadTooLargeError
from deployments.ingress.guard import MULTIPART_MARGIN, GuardSettings
from deployments.protocol.openai.batches import BatchCreateRequest
from deployments.state import storage as storage_module
from deployments.state.files import data_path
from deployments.state.owners import Caller
from deployments.state.records import stored_owners
from deployments.state.storage import LocalStorage, open_storage
from tests.unit.fake_metrics import FakeMetrics

CHAT = "/v1/chat/completions"
SERVED = ServedNames(frozenset({"echo"}), frozenset({"embed"}))
ALICE, BOB = Caller(b"a" * 32), Caller(b"b" * 32)


def chat_line(custom_id: str, text: str = "hi", **extra: Any) -> dict[str, Any]:
    body = {"model": "echo", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body, **extra}


def jsonl(lines_: list[Any]) -> bytes:
    return b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines_)


# -- storage ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["local", "arrow"])
def test_storage_reads_writes_appends_lists_and_truncates(tmp_path, kind):
    if kind == "arrow":
        pytest.importorskip("pyarrow")  # an optional dependency: only URIs need it
        storage: Any = open_storage(str(tmp_path), backend="arrow")
        assert type(storage.fs).__name__ == "LocalFileSystem"
    else:
        storage = open_storage(str(tmp_path))
    assert storage.read("a/x.json") is None and storage.size("a/x.json") is None
    assert storage.names("a") == []
    storage.write("a/x.json", b"{}")
    storage.write("a/x.json", b'{"v": 1}')
    assert storage.read("a/x.json") == b'{"v": 1}'

    def cut_short() -> Any:
        yield b"half of it"
        raise OSError("the client went away")

    with pytest.raises(OSError):
        storage.write("a/cut.jsonl", cut_short())  # nothing kept, no temporary left
    storage.write("a/w.jsonl", iter([b"in ", b"chunks"]))
    assert storage.read("a/w.jsonl") == b"in chunks"
    storage.delete("a/w.jsonl")
    assert storage.create("b/once", b"first") and not storage.create("b/once", b"second")
    assert storage.read("b/once") == b"first" and storage.names("b") == ["once"]
    storage.append("a/y.jsonl", b"one\n")
    storage.append("a/y.jsonl", b"two\n")
    assert b"".join(storage.chunks("a/y.jsonl")) == b"one\ntwo\n"
    assert storage.names("a") == ["x.json", "y.jsonl"]  # no temporary left behind
    storage.truncate("a/y.jsonl", 4)
    assert storage.read("a/y.jsonl") == b"one\n"
    storage.delete("a/x.json")
    storage.delete("a/x.json")  # twice: nothing to do
    assert storage.names("a") == ["y.jsonl"]


def test_replicas_starting_together_settle_on_one_owners_secret(tmp_path):
    for attempt in range(5):  # eight at the same instant, five times: a race shows in most attempts
        storage = LocalStorage(str(tmp_path / str(attempt)))
        barrier = threading.Barrier(8)

        def one(_: int, storage: LocalStorage = storage, barrier: threading.Barrier = barrier) -> str:
            barrier.wait()
            return stored_owners(storage).tag(ALICE) or ""

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            tags = set(pool.map(one, range(8)))
        assert len(tags) == 1 and stored_owners(storage).tag(ALICE) in tags


def test_a_10000_line_file_is_read_streamed(tmp_path, monkeypatch):
    monkeypatch.setattr(storage_module, "CHUNK_BYTES", 4096)
    storage = LocalStorage(str(tmp_path))
    storage.write("big.jsonl", jsonl([chat_line(f"line-{i}", "x" * 150) for i in range(10_000)]))
    size = storage.size("big.jsonl")
    assert size is not None and size > 2_000_000

    reads = 0
    chunks = storage.chunks

    def counted(path: str):
        nonlocal reads
        for chunk in chunks(path):
            reads += 1
            yield chunk

    monkeypatch.setattr(storage, "chunks", counted)
    reader = lines(storage, "big.jsonl")
    assert next(reader)[0] == 1
    assert reads == 1  # the first line came from the first chunk alone
    tracemalloc.start()
    count = 1 + sum(1 for _ in reader)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert count == 10_000
    assert peak < size // 20, peak  # a chunk and a line at a time, never the file


# -- validation ---------------------------------------------------------------------------------


def test_a_good_file_validates_with_its_count_and_model():
    found = validate(enumerate([json.dumps(chat_line(f"r{i}")).encode() for i in range(3)], 1), CHAT, SERVED, 10, 10)
    assert (found.total, found.model, found.errors) == (3, "echo", [])


def test_each_bad_line_is_reported_with_its_code_param_and_line():
    bad = [
        b"{not json",
        json.dumps(chat_line("a")).encode(),
        json.dumps(chat_line("a")).encode(),
        json.dumps({**chat_line("m"), "method": "GET"}).encode(),
        json.dumps({**chat_line("u"), "url": "/v1/embeddings"}).encode(),
        json.dumps({**chat_line("b"), "body": {"model": "echo"}}).encode(),
        json.dumps({**chat_line("n"), "body": {**chat_line("n")["body"], "model": "nope"}}).encode(),
        json.dumps({**chat_line("s"), "body": {**chat_line("s")["body"], "stream": True}}).encode(),
        json.dumps({"method": "POST"}).encode(),
    ]
    found = validate(enumerate(bad, 1), CHAT, SERVED, 100, 100)
    got = [(e.line, e.code, e.param) for e in found.errors]
    assert got == [
        (1, "invalid_json_line", None),
        (3, "duplicate_custom_id", "custom_id"),
        (4, "invalid_method", "method"),
        (5, "mismatched_endpoint", "url"),
        (6, "invalid_request", "body.messages"),
        (7, "model_not_found", "body.model"),
        (8, "invalid_request", "body.stream"),
        (9, "missing_required_parameter", "custom_id"),
    ]


def test_embedding_lines_name_embedding_models_and_caps_apply():
    line = {"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"model": "embed", "input": "x"}}
    assert validate([(1, json.dumps(line).encode())], "/v1/embeddings", SERVED, 10, 10).errors == []
    chat_model = {**line, "body": {"model": "echo", "input": "x"}}
    assert validate([(1, json.dumps(chat_model).encode())], "/v1/embeddings", SERVED, 10, 10).errors[0].code == (
        "model_not_found"
    )
    many = validate(
        enumerate([json.dumps(line | {"custom_id": str(i)}).encode() for i in range(3)], 1),
        "/v1/embeddings",
        SERVED,
        2,
        10,
    )
    assert [e.code for e in many.errors] == ["too_many_lines"]
    assert [e.code for e in validate([], CHAT, SERVED, 2, 10).errors] == ["empty_file"]


def test_lines_name_lora_adapters_as_requests_do():
    served = ServedNames(
        frozenset({"echo", "plain"}), frozenset({"embed"}), {"echo": ["sql"], "plain": []}, frozenset({"echo"})
    )

    def errors(model: str) -> list[str]:
        line = json.dumps(chat_line("x") | {"body": {"model": model, "messages": [{"role": "user", "content": "x"}]}})
        return [e.code for e in validate([(1, line.encode())], CHAT, served, 10, 10).errors]

    for model in ("echo:sql", "sql", "echo:any-under-dynamic-path"):
        assert errors(model) == [], model
    for model in ("plain:sql", "nope", "embed"):
        assert errors(model) == ["model_not_found"], model


# -- the runner over a fake ingress -------------------------------------------------------------


class FakeIngress:
    """`send` as Ingress.batch_line answers: the body's text echoed, a 400 for text "bad". With
    `hold_after`, the lines sent after that many wait for `gate`."""

    def __init__(self, hold_after: int | None = None) -> None:
        self.sent: list[str] = []
        self.calls = 0
        self.hold_after = hold_after
        self.gate = asyncio.Event()

    async def send(self, batch_id: str, endpoint: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        self.calls += 1
        if self.hold_after is not None and self.calls > self.hold_after:
            await self.gate.wait()
        text = body["messages"][0]["content"]
        self.sent.append(text)
        if text == "bad":
            error = {"message": "bad", "type": "invalid_request_error", "param": None, "code": "bad"}
            return {"status_code": 400, "body": {"error": error}}
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        return {"status_code": 200, "body": {"object": "chat.completion", "text": text, "usage": usage}}


def config(root: Path, **batches: Any) -> BatchRunnerConfig:
    settings = BatchesConfig(poll_interval_s=0.05, **{"max_concurrency": 2, **batches})
    return BatchRunnerConfig(batches=settings, storage_root=str(root), chat_models=["echo"], embedding_models=["embed"])


def submit(runtime: BatchRuntime, data: bytes, caller: Caller = ALICE) -> str:
    files = runtime.batches.files
    source = files.create("in.jsonl", data, "batch", caller)
    return runtime.batches.create(BatchCreateRequest(input_file_id=source["id"], endpoint=CHAT).new_batch(), caller)[
        "id"
    ]


async def settled(runtime: BatchRuntime, batch_id: str, caller: Caller = ALICE, timeout_s: float = 20.0) -> dict:
    loop = asyncio.create_task(runtime.loop())
    try:
        async with asyncio.timeout(timeout_s):
            while (batch := runtime.batches.retrieve(batch_id, caller))["status"] not in (
                "completed",
                "failed",
                "cancelled",
                "expired",
            ):
                await asyncio.sleep(0.02)
    finally:
        loop.cancel()
        await runtime.stop()
    return batch


def written(runtime: BatchRuntime, file_id: str | None, caller: Caller = ALICE) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in b"".join(runtime.batches.files.content(file_id, caller)).splitlines()]


async def test_a_batch_runs_to_completed_with_its_output_and_error_files(tmp_path):
    fake = FakeIngress()
    runtime = BatchRuntime(config(tmp_path), fake.send)
    batch_id = submit(runtime, jsonl([chat_line("a", "one"), chat_line("b", "bad"), chat_line("c", "three")]))
    batch = await settled(runtime, batch_id)
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    assert batch["usage"]["input_tokens"] == 6 and batch["usage"]["total_tokens"] == 10
    assert all(batch[f] for f in ("in_progress_at", "finalizing_at", "completed_at"))
    output = written(runtime, batch["output_file_id"])
    assert sorted(line["custom_id"] for line in output) == ["a", "c"]
    assert all(line["response"]["status_code"] == 200 and line["error"] is None for line in output)
    assert output[0]["id"] == f"batch_req_{output[0]['response']['request_id']}"
    [error] = written(runtime, batch["error_file_id"])
    assert (error["custom_id"], error["response"]["status_code"], error["error"]["code"]) == ("b", 400, "bad")
    assert runtime.batches.files.retrieve(batch["output_file_id"], ALICE)["purpose"] == "batch_output"


async def test_a_bad_file_fails_the_batch_and_runs_nothing(tmp_path):
    fake = FakeIngress()
    runtime = BatchRuntime(config(tmp_path), fake.send)
    batch_id = submit(runtime, jsonl([chat_line("a"), b"{oops", chat_line("a")]))
    batch = await settled(runtime, batch_id)
    assert batch["status"] == "failed" and batch["failed_at"]
    assert [(e["line"], e["code"]) for e in batch["errors"]["data"]] == [
        (2, "invalid_json_line"),
        (3, "duplicate_custom_id"),
    ]
    assert fake.sent == [] and batch["output_file_id"] is None


async def test_cancel_stops_sending_and_keeps_the_finished_lines(tmp_path):
    fake = FakeIngress(hold_after=3)  # the fourth line held in flight
    runtime = BatchRuntime(config(tmp_path, max_concurrency=1), fake.send)
    batch_id = submit(runtime, jsonl([chat_line(f"r{i}", f"t{i}") for i in range(20)]))
    loop = asyncio.create_task(runtime.loop())
    async with asyncio.timeout(20):
        while fake.calls < 4:
            await asyncio.sleep(0.01)
    assert runtime.batches.cancel(batch_id, ALICE)["status"] == "cancelling"
    runtime.wake()
    async with asyncio.timeout(20):
        while runtime.batches.retrieve(batch_id, ALICE)["status"] != "cancelled":
            await asyncio.sleep(0.01)
    loop.cancel()
    batch = runtime.batches.retrieve(batch_id, ALICE)
    assert batch["cancelled_at"] and batch["cancelling_at"]
    done = written(runtime, batch["output_file_id"])
    assert len(done) == 3 and batch["request_counts"]["completed"] == 3
    assert runtime.batches.cancel(batch_id, ALICE)["status"] == "cancelled"  # again: nothing more to do


async def test_a_runner_killed_mid_batch_resumes_every_line_exactly_once(tmp_path):
    fake = FakeIngress(hold_after=12)
    first = BatchRuntime(config(tmp_path), fake.send)
    batch_id = submit(first, jsonl([chat_line(f"r{i}", "bad" if i % 5 == 0 else f"t{i}") for i in range(30)]))
    loop = asyncio.create_task(first.loop())
    async with asyncio.timeout(20):
        while fake.calls < 14:  # 12 answered, 2 held in flight
            await asyncio.sleep(0.005)
    loop.cancel()
    await first.stop()  # the runner killed: its lines in flight are lost, not written
    record = first.batches.records.load(batch_id)
    assert record is not None and record["object"]["status"] == "in_progress"
    output = data_path(record["files"]["output"])
    first.batches.storage.append(output, b'{"custom_id": "torn')  # a crash mid-append

    assert len(fake.sent) == 12
    fake.gate.set()
    second = BatchRuntime(config(tmp_path), fake.send)
    batch = await settled(second, batch_id)
    assert batch["status"] == "completed"
    ids = [
        line["custom_id"] for line in written(second, batch["output_file_id"]) + written(second, batch["error_file_id"])
    ]
    assert sorted(ids) == sorted(f"r{i}" for i in range(30))  # each exactly once
    assert batch["request_counts"] == {"total": 30, "completed": 24, "failed": 6}
    assert len(fake.sent) == 30  # the 12 finished lines were not sent again


async def test_a_line_whose_answer_cannot_be_written_is_run_again_not_lost(tmp_path, monkeypatch):
    fake = FakeIngress()
    runtime = BatchRuntime(config(tmp_path), fake.send)
    batch_id = submit(runtime, jsonl([chat_line(f"r{i}") for i in range(4)]))
    storage, append, failures = runtime.batches.storage, runtime.batches.storage.append, []

    def append_failing_once(path: str, data: bytes) -> None:
        if path.startswith("file-data/") and not failures:
            failures.append(path)
            raise OSError("the storage root went away")
        append(path, data)

    monkeypatch.setattr(storage, "append", append_failing_once)
    batch = await settled(runtime, batch_id)
    assert failures and batch["status"] == "completed", batch
    assert batch["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
    assert sorted(line["custom_id"] for line in written(runtime, batch["output_file_id"])) == [
        f"r{i}" for i in range(4)
    ]


def test_resume_cuts_a_torn_line_and_counts_what_is_written(tmp_path):
    storage = LocalStorage(str(tmp_path))
    ok = {
        "custom_id": "a",
        "response": {"status_code": 200, "body": {"usage": {"prompt_tokens": 2, "completion_tokens": 1}}},
    }
    storage.append("out", jsonl([ok]) + b'{"custom_id": "b", "resp')
    storage.append("err", jsonl([{"custom_id": "c", "response": None, "error": {"code": "x"}}]))
    progress = resume(storage, "out", "err")
    assert progress.done == {"a", "c"} and (progress.completed, progress.failed) == (1, 1)
    assert (progress.input_tokens, progress.output_tokens) == (2, 1)
    assert storage.read("out") == jsonl([ok])
    assert resume(storage, "missing", "err").failed == 1


def expiring(runtime: BatchRuntime, batch_id: str, at: int) -> None:
    record = runtime.batches.records.load(batch_id)
    assert record is not None
    record["object"]["expires_at"] = at
    runtime.batches.records.save(batch_id, record)


async def test_a_batch_past_its_window_expires_each_unrun_line_batch_expired(tmp_path):
    fake = FakeIngress()
    runtime = BatchRuntime(config(tmp_path), fake.send)
    batch_id = submit(runtime, jsonl([chat_line("a"), chat_line("b")]))
    expiring(runtime, batch_id, 1)  # long past
    batch = await settled(runtime, batch_id)
    assert batch["status"] == "expired" and batch["expired_at"] and fake.sent == []
    assert batch["request_counts"] == {"total": 2, "completed": 0, "failed": 2} and batch["output_file_id"] is None
    errors = written(runtime, batch["error_file_id"])
    assert sorted(line["custom_id"] for line in errors) == ["a", "b"]
    assert all(line["response"] is None and line["error"]["code"] == "batch_expired" for line in errors)


async def test_a_batch_expiring_mid_run_keeps_its_finished_lines(tmp_path):
    fake = FakeIngress(hold_after=1)  # "a" answers; the lines after it never do
    runtime = BatchRuntime(config(tmp_path), fake.send)
    batch_id = submit(runtime, jsonl([chat_line("a"), chat_line("b"), chat_line("c")]))
    expiring(runtime, batch_id, int(time.time()) + 2)  # whole seconds, as OpenAI's
    batch = await settled(runtime, batch_id)
    assert batch["status"] == "expired"
    assert batch["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    assert [line["custom_id"] for line in written(runtime, batch["output_file_id"])] == ["a"]
    errors = written(runtime, batch["error_file_id"])
    assert sorted(line["custom_id"] for line in errors) == ["b", "c"]
    assert {line["error"]["code"] for line in errors} == {"batch_expired"}


# -- owners -------------------------------------------------------------------------------------


def test_files_and_batches_are_seen_only_by_their_key(tmp_path, caplog):
    runtime = BatchRuntime(config(tmp_path), FakeIngress().send)
    files, batches = runtime.batches.files, runtime.batches
    batch_id = submit(runtime, jsonl([chat_line("a")]), ALICE)
    file_id = batches.retrieve(batch_id, ALICE)["input_file_id"]
    for read in (
        lambda: files.retrieve(file_id, BOB),
        lambda: files.content(file_id, BOB),
        lambda: files.delete(file_id, BOB),
        lambda: batches.retrieve(batch_id, BOB),
        lambda: batches.cancel(batch_id, BOB),
        lambda: batches.create(BatchCreateRequest(input_file_id=file_id, endpoint=CHAT).new_batch(), BOB),
    ):
        with pytest.raises(ObjectNotFoundError):
            read()
    assert batches.list(BOB, 20, None)["data"] == [] and files.list(BOB, None, 100, None, "desc")["data"] == []
    assert [b["id"] for b in batches.list(ALICE, 20, None)["data"]] == [batch_id]
    assert "belongs to another API key" in caplog.text
    # after a restart (a new runtime on the same root) the same key still owns them
    again = BatchRuntime(config(tmp_path), FakeIngress().send)
    assert again.batches.retrieve(batch_id, ALICE)["id"] == batch_id
    with pytest.raises(ObjectNotFoundError):
        again.batches.retrieve(batch_id, BOB)


def test_uploads_are_capped_in_bytes_lines_and_purpose(tmp_path):
    runtime = BatchRuntime(config(tmp_path, max_file_bytes=1000, max_file_lines=2), FakeIngress().send)
    files = runtime.batches.files
    with pytest.raises(PayloadTooLargeError):
        files.create("f", b"x" * 1001, "batch", ALICE)
    with pytest.raises(InvalidRequestError):
        files.create("f", b"{}\n{}\n{}", "batch", ALICE)
    with pytest.raises(InvalidRequestError):
        files.create("f", b"{}", "fine-tune", ALICE)
    # Streamed (the route's chunks): the caps hold as the chunks come, and a refused upload keeps nothing.
    with pytest.raises(PayloadTooLargeError):
        files.create("f", iter([b"x" * 600, b"x" * 600]), "batch", ALICE)
    with pytest.raises(InvalidRequestError, match="at most 2 lines"):
        files.create("f", iter([b"{}\n{", b"}\n{}"]), "batch", ALICE)
    assert files.storage.names("file-data") == [] and files.list(ALICE, None, 10, None, "desc")["data"] == []
    streamed = files.create("in.jsonl", iter([b'{"a"', b": 1}\n", b"{}"]), "batch", ALICE)
    assert streamed["bytes"] == 11 and b"".join(files.content(streamed["id"], ALICE)) == b'{"a": 1}\n{}'
    kept = files.create("notes.txt", b"a\nb\nc\n", "user_data", ALICE)
    assert kept["object"] == "file" and kept["bytes"] == 6 and kept["purpose"] == "user_data"
    assert files.delete(kept["id"], ALICE)["deleted"] is True
    with pytest.raises(ObjectNotFoundError):
        files.retrieve(kept["id"], ALICE)


async def test_an_input_file_deleted_mid_run_fails_the_batch(tmp_path):
    fake = FakeIngress(hold_after=2)
    runtime = BatchRuntime(config(tmp_path, max_concurrency=1), fake.send)
    batch_id = submit(runtime, jsonl([chat_line(f"r{i}") for i in range(5)]))
    loop = asyncio.create_task(runtime.loop())
    async with asyncio.timeout(20):
        while fake.calls < 3:
            await asyncio.sleep(0.01)
    loop.cancel()
    await runtime.stop()  # the runner stopped with the batch in progress
    runtime.batches.files.delete(runtime.batches.retrieve(batch_id, ALICE)["input_file_id"], ALICE)
    fake.gate.set()
    again = BatchRuntime(config(tmp_path), fake.send)
    batch = await settled(again, batch_id)
    assert batch["status"] == "failed" and batch["errors"]["data"][0]["code"] == "file_not_found"


def test_uploads_to_v1_files_have_their_own_body_cap():
    server = ServerConfig(max_body_bytes=1000, batches=BatchesConfig(max_file_bytes=5000))
    guard = GuardSettings.from_config(server, environ={})
    files: Scope = {"type": "http", "path": "/v1/files"}
    chat: Scope = {"type": "http", "path": "/v1/chat/completions"}
    assert guard.cap(files) == 5000 + MULTIPART_MARGIN and guard.cap(chat) == 1000


async def test_the_runner_counts_lines_queued_running_and_done(tmp_path):
    fake, metrics = FakeIngress(hold_after=2), FakeMetrics()
    runtime = BatchRuntime(config(tmp_path, max_concurrency=1), fake.send, metrics)
    batch_id = submit(runtime, jsonl([chat_line("a"), chat_line("b", "bad"), *(chat_line(f"r{i}") for i in range(3))]))
    loop = asyncio.create_task(runtime.loop())
    async with asyncio.timeout(20):
        while metrics.gauges.get("batch_lines_running") != 1 or metrics.gauges.get("batch_lines_queued") != 2:
            await asyncio.sleep(0.01)  # the third line held in flight, two not sent
    fake.gate.set()
    loop.cancel()
    batch = await settled(runtime, batch_id)
    assert batch["status"] == "completed"
    assert (
        metrics.count("batch_lines_done", outcome="completed"),
        metrics.count("batch_lines_done", outcome="failed"),
    ) == (4, 1)

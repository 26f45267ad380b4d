"""The batch runner: drives every batch of the storage root from `validating` to a final status.

Why a Serve deployment with one replica (`BatchRunner`), and not a detached actor: Serve starts it with
the application, replaces it when it dies (its health check fails when its loop has died) and removes
it with the application; it needs no state of its own, because everything is in the storage root,
so a replacement (or the service after a restart) resumes where the last one stopped. Its lines go to
the ingress through the ingress's deployment handle (`Ingress.batch_line`, the same service code as
the HTTP routes, without an HTTP hop), and Serve spreads them over the ingress and decoder replicas
as it routes any request. At most `server.batches.max_concurrency` lines are in flight, over all
batches; the input file is read streamed, a line sent only once a slot is free.

A batch (`BatchJob`): `validating` (the whole file checked, `validation.py`; a bad file fails the
batch and runs nothing) -> `in_progress` (lines sent; each finished line appended to the output or
the error file at once: the progress, `progress.py`) -> `finalizing` (the two files recorded as
files) -> `completed`; or `cancelling` -> `cancelled` when the cancel marker appears (in-flight lines
are abandoned, finished ones kept), `expired` past the completion window, `failed` at validation.
Each change of status is one log line."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict
from ray import serve

from deployments.config import BatchesConfig
from deployments.ingress.apis.batches.protocol import TERMINAL, Batch, BatchErrors, output_line
from deployments.ingress.batches.files import FileStore, data_path, new_file_id
from deployments.ingress.batches.progress import Progress, resume
from deployments.ingress.batches.records import stored_owners
from deployments.ingress.batches.storage import lines, open_storage
from deployments.ingress.batches.store import BatchStore, cancel_marker
from deployments.ingress.batches.validation import ServedNames, validate
from deployments.monitoring.metrics import BATCH_METRICS, Recorder

logger = logging.getLogger("ray.serve")

Send = Callable[[str, dict[str, Any], str], Awaitable[dict[str, Any]]]
"""How a line is run: (endpoint, body, request id) -> {"status_code", "body"} (`Ingress.batch_line`)."""

BATCH_PRIORITY = 10
"""vLLM's request `priority` of every batch line (lower runs earlier; interactive requests have 0), so
that batches take the decoders' idle capacity."""

TRANSPORT_TRIES = 3
RETRY_MAX_S = 60.0  # the longest wait before a batch whose job failed is tried again


def prioritized(endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """A batch line's request body as it is sent: the one place where a batch line gets its priority
    (on the endpoints that take vLLM's `priority`; a line may ask to wait longer, never to go first)."""
    if endpoint in ("/v1/chat/completions", "/v1/completions"):
        asked = body.get("priority")
        return {**body, "priority": max(asked, BATCH_PRIORITY) if isinstance(asked, int) else BATCH_PRIORITY}
    return body


class BatchJob:
    """One batch, run to a final status by `run` (and resumed by the same call after a restart)."""

    def __init__(
        self,
        batch_id: str,
        batches: BatchStore,
        served: ServedNames,
        config: BatchesConfig,
        send: Send,
        slots: asyncio.Semaphore,
        metrics: Recorder | None = None,
        line_timeout_s: float = 330.0,
    ) -> None:
        self.batch_id = batch_id
        self._batches = batches
        self._storage = batches.storage
        self._served = served
        self._config = config
        self._send = send
        self._slots = slots
        self._metrics = metrics
        self._line_timeout_s = line_timeout_s
        self._cancelled = asyncio.Event()
        self._record: dict[str, Any] = {}
        self._saved_at = 0.0
        self.running = 0  # lines in flight
        self.queued = 0  # lines not yet sent

    def cancel(self) -> None:
        """Stop sending lines and abandon those in flight (called when the cancel marker appears)."""
        self._cancelled.set()

    @property
    def batch(self) -> Batch:
        return Batch.model_validate(self._record["object"])

    def _save(self, batch: Batch) -> None:
        self._record["object"] = batch.model_dump()
        self._batches.records.save(self.batch_id, self._record)
        self._saved_at = time.monotonic()

    def _move(self, batch: Batch, status: str, **fields: Any) -> Batch:
        """A change of status, saved and logged."""
        now = int(time.time())
        stamp = {
            "in_progress": "in_progress_at",
            "finalizing": "finalizing_at",
            "completed": "completed_at",
            "failed": "failed_at",
            "expired": "expired_at",
            "cancelling": "cancelling_at",
            "cancelled": "cancelled_at",
        }.get(status)
        changed = batch.model_copy(update={"status": status, **({stamp: now} if stamp else {}), **fields})
        self._save(changed)
        counts = changed.request_counts
        logger.info(
            "batch %s: %s -> %s (%d/%d done, %d failed)",
            self.batch_id,
            batch.status,
            status,
            counts.completed + counts.failed,
            counts.total,
            counts.failed,
        )
        return changed

    def _cancel_requested(self) -> bool:
        if not self._cancelled.is_set() and self._storage.size(cancel_marker(self.batch_id)) is not None:
            self._cancelled.set()
        return self._cancelled.is_set()

    async def run(self) -> Batch:
        record = await asyncio.to_thread(self._batches.records.load, self.batch_id)
        if record is None:
            raise LookupError(self.batch_id)
        self._record = record
        batch = self.batch
        if batch.status == "validating":
            batch = await self._validate(batch)
        if batch.status in TERMINAL:
            return batch
        files = self._record["files"]
        output, error = data_path(files["output"]), data_path(files["error"])
        progress = await asyncio.to_thread(resume, self._storage, output, error)
        if batch.status == "in_progress" and self._storage.size(data_path(batch.input_file_id)) is None:
            gone = {"code": "file_not_found", "message": f"The input file {batch.input_file_id!r} was deleted."}
            return self._move(batch, "failed", errors=BatchErrors.model_validate({"data": [gone]}))
        if batch.status == "in_progress" and not self._cancel_requested() and not self._expired(batch):
            batch = await self._run_lines(batch, progress, output, error)
        return await self._finish(batch, progress)

    async def _validate(self, batch: Batch) -> Batch:
        source = data_path(batch.input_file_id)
        if self._storage.size(source) is None:
            found_errors = [{"code": "file_not_found", "message": f"The input file {batch.input_file_id!r} is gone."}]
            return self._move(batch, "failed", errors=BatchErrors.model_validate({"data": found_errors}))
        config = self._config
        checked = await asyncio.to_thread(
            validate,
            lines(self._storage, source),
            batch.endpoint,
            self._served,
            config.max_file_lines,
            config.max_errors_reported,
        )
        counts = batch.request_counts.model_copy(update={"total": checked.total})
        if checked.errors:
            return self._move(batch, "failed", errors=BatchErrors(data=checked.errors), request_counts=counts)
        self._record["files"] = {"output": new_file_id(), "error": new_file_id()}
        return self._move(batch, "in_progress", model=checked.model, request_counts=counts)

    def _expired(self, batch: Batch) -> bool:
        return batch.expires_at is not None and time.time() > batch.expires_at

    async def _run_lines(self, batch: Batch, progress: Progress, output: str, error: str) -> Batch:
        in_flight: set[asyncio.Task[None]] = set()

        async def one(custom_id: str, body: dict[str, Any]) -> None:
            request_id = uuid.uuid4().hex
            result = await self._sent(batch.endpoint, prioritized(batch.endpoint, body), request_id)
            ok = result["status_code"] == 200
            if ok:
                line = output_line(custom_id, request_id, 200, result["body"])
            else:
                failure = (result["body"] or {}).get("error") or {}
                line = output_line(
                    custom_id,
                    request_id,
                    result["status_code"],
                    result["body"],
                    {"code": failure.get("code") or failure.get("type"), "message": failure.get("message")},
                )
            # On the loop, no await between: a line appended is a line counted, even when cancelled.
            self._storage.append(output if ok else error, (json.dumps(line) + "\n").encode())
            progress.count(line, ok)
            if self._metrics is not None:
                self._metrics.inc("batch_lines_done", 1, {"outcome": "completed" if ok else "failed"})

        def finished(task: asyncio.Task[None]) -> None:
            in_flight.discard(task)
            self.running -= 1
            self._slots.release()

        try:
            stop = False
            for _, raw in lines(self._storage, data_path(batch.input_file_id)):
                line = json.loads(raw)
                if line["custom_id"] in progress.done:
                    continue
                if not await self._slot(batch):
                    stop = True
                    break
                self.running += 1
                task = asyncio.create_task(one(line["custom_id"], line["body"]))
                in_flight.add(task)
                task.add_done_callback(finished)
                self._progress(batch, progress)
            while in_flight:
                if stop or self._cancel_requested() or self._expired(batch):
                    for task in in_flight:
                        task.cancel()
                await asyncio.wait(set(in_flight), timeout=self._config.poll_interval_s)
                self._progress(batch, progress)
        finally:  # the job itself cancelled (the runner stopping): its lines in flight too
            for task in in_flight:
                task.cancel()
        return self.batch

    async def _slot(self, batch: Batch) -> bool:
        """Wait for a free slot (True), watching for a cancel or the window's end meanwhile (False)."""
        while not (self._cancel_requested() or self._expired(batch)):
            try:
                await asyncio.wait_for(self._slots.acquire(), self._config.poll_interval_s)
            except TimeoutError:
                continue
            if self._cancel_requested() or self._expired(batch):
                self._slots.release()
                return False
            return True
        return False

    def _progress(self, batch: Batch, progress: Progress) -> None:
        """The counts in the batch's record, at most once per poll interval (readers see them move)."""
        self.queued = max(0, batch.request_counts.total - progress.completed - progress.failed - self.running)
        if time.monotonic() - self._saved_at >= self._config.poll_interval_s:
            self._save(
                self.batch.model_copy(
                    update={"request_counts": progress.counts(batch.request_counts.total), "usage": progress.usage()}
                )
            )

    async def _sent(self, endpoint: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        """The line's answer; a failure to reach the ingress is retried, then the line's error."""
        for attempt in range(TRANSPORT_TRIES):
            try:
                return await asyncio.wait_for(self._send(endpoint, body, request_id), self._line_timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if attempt == TRANSPORT_TRIES - 1:
                    logger.warning("batch %s: line %s could not be sent: %r", self.batch_id, request_id, exc)
                    message = f"The line could not be sent to the service: {type(exc).__name__}."
                    return {
                        "status_code": 503,
                        "body": {
                            "error": {"message": message, "type": "service_unavailable", "param": None, "code": None}
                        },
                    }
                await asyncio.sleep(2**attempt)
        raise AssertionError("unreachable")

    async def _finish(self, batch: Batch, progress: Progress) -> Batch:
        done = progress.completed + progress.failed
        batch = batch.model_copy(
            update={"request_counts": progress.counts(batch.request_counts.total), "usage": progress.usage()}
        )
        if self._cancel_requested():
            final = "cancelled"
            if batch.status != "cancelling":
                batch = self._move(batch, "cancelling")
        elif done < batch.request_counts.total and self._expired(batch):
            final = "expired"
        else:
            final = "completed"
            if batch.status != "finalizing":
                batch = self._move(batch, "finalizing")
        files = self._record["files"]
        owner = self._record.get("owner")
        kept: dict[str, Any] = {}
        for kind, count in (("output", progress.completed), ("error", progress.failed)):
            if count:
                file_id = files[kind]
                size = self._storage.size(data_path(file_id)) or 0
                self._batches.files.keep(file_id, f"{self.batch_id}_{kind}.jsonl", "batch_output", size, owner)
                kept[f"{kind}_file_id"] = file_id
        batch = self._move(batch, final, **kept)
        self._storage.delete(cancel_marker(self.batch_id))
        self.queued = 0
        return batch


class BatchRunnerConfig(BaseModel):
    """What the runner needs: the settings, the models lines may name, where the ingress is."""

    model_config = ConfigDict(extra="forbid")

    batches: BatchesConfig
    chat_models: list[str]
    embedding_models: list[str] = []
    ingress_deployment: str = "Ingress"
    line_timeout_s: float = 330.0  # a line's answer through the handle: the request deadline and a margin


class BatchRuntime:
    """The runner's loop over the storage root, apart from Serve (unit tests drive it with a fake `send`)."""

    def __init__(self, config: BatchRunnerConfig, send: Send, metrics: Recorder | None = None) -> None:
        storage = open_storage(config.batches.storage_root)
        owners = stored_owners(storage)
        self.batches = BatchStore(FileStore(storage, owners, config.batches))
        self._config = config
        self._send = send
        self._metrics = metrics
        self._served = ServedNames(frozenset(config.chat_models), frozenset(config.embedding_models))
        self._slots = asyncio.Semaphore(config.batches.max_concurrency)
        self._jobs: dict[str, tuple[BatchJob, asyncio.Task[Batch]]] = {}
        self._final: set[str] = set()
        self._failures: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    def scan(self) -> None:
        """Start a job for each batch not final and not running; tell running ones of a cancel. A
        batch seen final is not read again; one whose job failed waits before its next try."""
        now = time.monotonic()
        for name in self.batches.storage.names(self.batches.records.folder):
            batch_id = name.removesuffix(".json")
            if not name.endswith(".json") or batch_id in self._final or batch_id in self._jobs:
                continue
            if self._retry_at.get(batch_id, 0.0) > now:
                continue
            record = self.batches.records.load(batch_id)
            if record is None:
                continue
            if record["object"]["status"] in TERMINAL:
                self._final.add(batch_id)
                continue
            job = BatchJob(
                batch_id,
                self.batches,
                self._served,
                self._config.batches,
                self._send,
                self._slots,
                self._metrics,
                self._config.line_timeout_s,
            )
            task = asyncio.create_task(job.run())
            task.add_done_callback(functools.partial(self._ended, batch_id))
            self._jobs[batch_id] = (job, task)
        for batch_id, (job, _) in list(self._jobs.items()):
            if self.batches.storage.size(cancel_marker(batch_id)) is not None:
                job.cancel()

    def _ended(self, batch_id: str, task: asyncio.Task[Batch]) -> None:
        self._jobs.pop(batch_id, None)
        if task.cancelled():
            return
        if task.exception() is not None:
            failures = self._failures[batch_id] = self._failures.get(batch_id, 0) + 1
            delay = min(RETRY_MAX_S, 2.0**failures)
            self._retry_at[batch_id] = time.monotonic() + delay
            logger.error(
                "batch %s: the runner failed (%d times); it retries in %gs",
                batch_id,
                failures,
                delay,
                exc_info=task.exception(),
            )
        else:
            self._final.add(batch_id)
            self._failures.pop(batch_id, None)

    async def loop(self) -> None:
        while True:
            try:
                self.scan()
                self._gauges()
            except Exception:
                logger.exception("the batch runner could not read its storage root; retrying")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._config.batches.poll_interval_s)
            self._wake.clear()

    def _gauges(self) -> None:
        if self._metrics is not None:
            jobs = [job for job, _ in self._jobs.values()]
            self._metrics.set("batch_lines_queued", sum(job.queued for job in jobs))
            self._metrics.set("batch_lines_running", sum(job.running for job in jobs))

    async def stop(self) -> None:
        for _, task in list(self._jobs.values()):
            task.cancel()
        for _, task in list(self._jobs.values()):
            with contextlib.suppress(BaseException):
                await task


@serve.deployment  # its options are the builder's (one replica)
class BatchRunner:
    """The batch runner of the application, as a Serve deployment (see the module's docstring)."""

    def __init__(self, config: BatchRunnerConfig) -> None:
        self._ingress_name = config.ingress_deployment
        self._ingress: Any = None
        metrics = Recorder(BATCH_METRICS, config.chat_models[0] if config.chat_models else "batch")
        metrics.export_zeros()
        self._runtime = BatchRuntime(config, self._send_line, metrics)
        self._loop = asyncio.get_running_loop().create_task(self._runtime.loop())
        logger.info(
            "batch runner: storage %s, %d lines at once", config.batches.storage_root, config.batches.max_concurrency
        )

    async def _send_line(self, endpoint: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        if self._ingress is None:
            app = serve.get_replica_context().app_name
            self._ingress = serve.get_deployment_handle(self._ingress_name, app_name=app)
        result: dict[str, Any] = await self._ingress.batch_line.remote(endpoint, body, request_id)
        return result

    async def wake(self) -> None:
        """Look at the storage root now (a batch was created or cancelled)."""
        self._runtime.wake()

    async def check_health(self) -> None:
        if self._loop.done():
            raise RuntimeError("the batch runner's loop ended") from (
                None if self._loop.cancelled() else self._loop.exception()
            )

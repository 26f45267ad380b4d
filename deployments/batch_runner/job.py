"""One batch's job, run by the batch runner (`runner.py`).

A batch (`BatchJob`): `validating` (the whole file checked, `validation.py`; a bad file fails the
batch and runs nothing) -> `in_progress` (lines sent; each finished line appended to the output or
the error file at once: the progress, `progress.py`) -> `finalizing` (the two files recorded as
files) -> `completed`; or `cancelling` -> `cancelled` when the cancel marker appears (in-flight lines
are abandoned, finished ones kept), `expired` past the completion window, `failed` at validation.
Each change of status is one log line.

A line fails alone: one that cannot be read while running (not JSON, over the line cap: a file
validated by an older version, a cap lowered since) gets a line in the error file with its `line`
number and code, and the others run. A job that cannot go on (an exception no line explains: the
storage root failing) raises; the runner tries it again a few times, then ends the batch (`end`):
`failed` with the reason, or `cancelled` when a cancel was asked. The input file is read in a thread,
a few lines ahead, so that the event loop (other batches, cancels) never waits on it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from deployments.batch_runner.input_lines import MAX_LINE_BYTES, lines, read_ahead, read_line, unreadable_line
from deployments.batch_runner.progress import Progress, resume
from deployments.batch_runner.validation import ServedNames, validate
from deployments.config import BatchesConfig
from deployments.errors import UnavailableError, to_openai_error
from deployments.monitoring.metrics import Recorder
from deployments.protocol.openai.batches import (
    EXPIRED_LINE,
    Batch,
    BatchError,
    BatchErrors,
    RequestCounts,
    output_line,
)
from deployments.state.batches import TERMINAL, BatchStore, cancel_marker
from deployments.state.files import data_path, new_file_id

logger = logging.getLogger("ray.serve")

Send = Callable[[str, str, dict[str, Any], str], Awaitable[dict[str, Any]]]
"""How a line is run: (batch id, endpoint, body, request id) -> {"status_code", "body"} (`Ingress.batch_line`)."""

TRANSPORT_TRIES = 3


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
        max_line_bytes: int = MAX_LINE_BYTES,
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
        self._max_line_bytes = max_line_bytes
        self._cancelled = asyncio.Event()
        self._record: dict[str, Any] = {}
        self._saved_at = 0.0
        self.running = 0  # lines in flight
        self.queued = 0  # lines not yet sent
        self.lines_written = 0  # lines this job appended to the output and error files

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
            lines(self._storage, source, self._max_line_bytes),
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
            result = await self._sent(batch.endpoint, body, request_id)
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
            self._written(line, ok, output if ok else error, progress)

        broken: list[BaseException] = []  # a line whose answer could not be written (the storage root failing)

        def finished(task: asyncio.Task[None]) -> None:
            in_flight.discard(task)
            self.running -= 1
            self._slots.release()
            if not task.cancelled() and (failure := task.exception()) is not None:
                broken.append(failure)

        reader = lines(self._storage, data_path(batch.input_file_id), self._max_line_bytes)
        try:
            stop = False
            while not (stop or broken) and (ahead := await asyncio.to_thread(read_ahead, reader)):
                for number, read in ahead:
                    if broken:
                        break
                    if isinstance(read, BatchError):  # this line fails alone, in the error file
                        if number not in progress.unreadable:
                            self._written(unreadable_line(number, read), False, error, progress)
                        continue
                    custom_id, body = read
                    if custom_id in progress.done:
                        continue
                    if not await self._slot(batch):
                        stop = True
                        break
                    self.running += 1
                    task = asyncio.create_task(one(custom_id, body))
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
        if broken:  # the runner retries the job later; resuming skips the lines written
            raise broken[0]
        return self.batch

    def _written(self, line: dict[str, Any], ok: bool, path: str, progress: Progress) -> None:
        """A finished line appended to its file and counted: on the loop, no await between, so that a
        line appended is a line counted, even when cancelled.
        """
        self._storage.append(path, (json.dumps(line) + "\n").encode())
        progress.count(line, ok)
        self.lines_written += 1
        if self._metrics is not None:
            self._metrics.inc("batch_lines_done", 1, {"outcome": "completed" if ok else "failed"})

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
            self._save(progress.applied(self.batch, batch.request_counts.total))

    async def _sent(self, endpoint: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        """The line's answer; a failure to reach the ingress is retried, then the line's error (a 503,
        as `UnavailableError` maps).
        """
        failure: Exception | None = None
        for attempt in range(TRANSPORT_TRIES):
            if attempt:
                await asyncio.sleep(2 ** (attempt - 1))
            try:
                return await asyncio.wait_for(
                    self._send(self.batch_id, endpoint, body, request_id), self._line_timeout_s
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failure = exc
        logger.warning("batch %s: line %s could not be sent: %r", self.batch_id, request_id, failure)
        unsent = UnavailableError(f"The line could not be sent to the service: {type(failure).__name__}.")
        status, error, _ = to_openai_error(unsent, request_id)
        return {"status_code": status, "body": error}

    def _expire_the_rest(self, batch: Batch, progress: Progress) -> None:
        """OpenAI's expiry: each line that did not run gets a line in the error file, `batch_expired`
        (and counts as failed); written a megabyte at a time, the input read streamed.
        """
        source, error = data_path(batch.input_file_id), data_path(self._record["files"]["error"])
        if self._storage.size(source) is None:
            return
        pending = bytearray()
        for number, raw in lines(self._storage, source, self._max_line_bytes):
            read = read_line(raw)
            if isinstance(read, BatchError):  # it failed for its own reason, not the window's
                if number in progress.unreadable:
                    continue
                line = unreadable_line(number, read)
            elif read[0] in progress.done:
                continue
            else:
                line = output_line(read[0], uuid.uuid4().hex, None, None, EXPIRED_LINE)
            pending += (json.dumps(line) + "\n").encode()
            progress.count(line, ok=False)
            if len(pending) >= 2**20:
                self._storage.append(error, bytes(pending))
                pending.clear()
        if pending:
            self._storage.append(error, bytes(pending))

    async def _finish(self, batch: Batch, progress: Progress) -> Batch:
        done = progress.completed + progress.failed
        # Past the window with lines unrun, or their batch_expired lines already written (a restart mid-way).
        unrun = done < batch.request_counts.total or progress.expired > 0
        expired = not self._cancel_requested() and unrun and self._expired(batch)
        if expired:
            await asyncio.to_thread(self._expire_the_rest, batch, progress)
        batch = progress.applied(batch)
        if self._cancel_requested():
            final = "cancelled"
            if batch.status != "cancelling":
                batch = self._move(batch, "cancelling")
        elif expired:
            final = "expired"
        else:
            final = "completed"
            if batch.status != "finalizing":
                batch = self._move(batch, "finalizing")
        batch = self._move(batch, final, **self._keep(batch.request_counts))
        self._storage.delete(cancel_marker(self.batch_id))
        self.queued = 0
        return batch

    def _keep(self, counts: RequestCounts) -> dict[str, Any]:
        """The output and error files recorded as files (those with lines): the batch's fields naming them."""
        files = self._record.get("files") or {}
        owner = self._record.get("owner")
        kept: dict[str, Any] = {}
        for kind, count in (("output", counts.completed), ("error", counts.failed)):
            if count and kind in files:
                file_id = files[kind]
                size = self._storage.size(data_path(file_id)) or 0
                self._batches.files.keep(file_id, f"{self.batch_id}_{kind}.jsonl", "batch_output", size, owner)
                kept[f"{kind}_file_id"] = file_id
        return kept

    async def end(self, reason: BatchError | None) -> Batch:
        """End the batch without running another line, where its job cannot: `cancelled` when a cancel
        was asked (its job failing or stuck), else `failed` with `reason` in its errors (the runner gave
        up on its job). The lines finished so far stay in its output and error files, which it names.
        Without a cancel or a reason, the batch is left as it is.
        """
        record = await asyncio.to_thread(self._batches.records.load, self.batch_id)
        if record is None:
            raise LookupError(self.batch_id)
        self._record = record
        batch = self.batch
        cancelled = self._cancel_requested()
        if batch.status in TERMINAL or not (cancelled or reason):
            return batch
        if files := record.get("files"):
            output, error = data_path(files["output"]), data_path(files["error"])
            try:
                progress = await asyncio.to_thread(resume, self._storage, output, error)
            except Exception:  # the files may be why the job failed: keep the counts last saved
                logger.warning("batch %s: its output and error files cannot be read back", self.batch_id, exc_info=True)
            else:
                batch = progress.applied(batch)
        kept = self._keep(batch.request_counts)
        if cancelled:
            if batch.status != "cancelling":
                batch = self._move(batch, "cancelling")
            batch = self._move(batch, "cancelled", **kept)
        else:
            assert reason is not None
            batch = self._move(batch, "failed", errors=BatchErrors(data=[reason]), **kept)
        self._storage.delete(cancel_marker(self.batch_id))
        self.queued = 0
        return batch

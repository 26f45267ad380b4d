"""The batch runner: drives every batch of the storage root from `validating` to a final status.

Why a Serve deployment with one replica (`BatchRunner`), and not a detached actor: Serve starts it with
the application, replaces it when it dies (its health check fails when its loop has died) and removes
it with the application; it needs no state of its own, because everything is in the storage root,
so a replacement (or the service after a restart) resumes where the last one stopped. Its lines go to
the ingress through the ingress's deployment handle (`Ingress.batch_line`, the same service code as
the HTTP routes, without an HTTP hop), and Serve spreads them over the ingress and decoder replicas
as it routes any request. At most `server.batches.max_concurrency` lines are in flight, over all
batches; the input file is read streamed, a line sent only once a slot is free.

The lines of one batch run in its job (`job.py`). A job that raises (an exception no line explains)
is tried again after `RETRY_BASE_S`, then four times that; at its `JOB_TRIES`-th failure in a row with
no line finished in between, the runner gives up: the batch ends `failed`, its `errors` naming the
exception's type (the traceback in the log). A cancel always ends the batch `cancelled`: at once for
one whose job is failing (its next try not awaited), and for a job still running `CANCEL_GRACE_S`
after the cancel (stuck: reading a huge file, its storage hanging), by cancelling that job.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from ray import serve

from deployments.batch_runner.input_lines import MAX_LINE_BYTES
from deployments.batch_runner.job import BatchJob, Send
from deployments.batch_runner.validation import ServedNames
from deployments.config import BatchesConfig
from deployments.monitoring.metrics import BATCH_METRICS, Recorder
from deployments.protocol.openai.batches import Batch, BatchError
from deployments.state.batches import TERMINAL, BatchStore, cancel_marker
from deployments.state.storage import open_storage

logger = logging.getLogger("ray.serve")

RETRY_MAX_S = 60.0  # the longest wait before a batch whose job failed is tried again
RETRY_BASE_S = 2.0  # the wait after a job's first failure; four times longer after each next one
JOB_TRIES = 3  # failures in a row, no line finished between, after which the batch fails
CANCEL_GRACE_S = 10.0  # how long a running job may take to stop once cancelled, before it is cancelled itself


class BatchRunnerConfig(BaseModel):
    """What the runner needs: the settings, the models lines may name, where the ingress is."""

    model_config = ConfigDict(extra="forbid")

    batches: BatchesConfig
    storage_root: str  # server.state.storage_root
    chat_models: list[str]
    embedding_models: list[str] = []
    adapters: dict[str, list[str]] = {}  # each chat model's listed LoRA adapters
    dynamic_adapters: list[str] = []  # the chat models with a lora.dynamic_path
    ingress_deployment: str = "Ingress"
    line_timeout_s: float = 330.0  # a line's answer through the handle: the request deadline and a margin
    max_line_bytes: int = Field(MAX_LINE_BYTES, gt=0)  # a line's cap: server.max_body_bytes


class BatchRuntime:
    """The runner's loop over the storage root, apart from Serve (unit tests drive it with a fake `send`)."""

    def __init__(self, config: BatchRunnerConfig, send: Send, metrics: Recorder | None = None) -> None:
        self.batches = BatchStore.open(config.batches, open_storage(config.storage_root))
        self._config = config
        self._send = send
        self._metrics = metrics
        self._served = ServedNames(
            frozenset(config.chat_models),
            frozenset(config.embedding_models),
            config.adapters,
            frozenset(config.dynamic_adapters),
        )
        self._slots = asyncio.Semaphore(config.batches.max_concurrency)
        self._jobs: dict[str, tuple[BatchJob, asyncio.Task[Batch]]] = {}
        self._final: set[str] = set()
        self._failures: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}
        self._given_up: dict[str, BatchError] = {}  # batches whose job failed JOB_TRIES times: why
        self._cancel_seen: dict[str, float] = {}  # running jobs' batches cancelled: when the cancel was seen
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    def scan(self) -> None:
        """Start a job for each batch not final and not running; tell running ones of a cancel. A
        batch seen final is not read again; one whose job failed waits before its next try, unless
        cancelled. A batch cancelled, or given up on, is ended (`BatchJob.end`) instead of run.
        """
        now = time.monotonic()
        for name in self.batches.storage.names(self.batches.records.folder):
            batch_id = name.removesuffix(".json")
            if not name.endswith(".json") or batch_id in self._final or batch_id in self._jobs:
                continue
            cancelled = self.batches.storage.size(cancel_marker(batch_id)) is not None
            if self._retry_at.get(batch_id, 0.0) > now and not cancelled:
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
                self._config.max_line_bytes,
            )
            reason = self._given_up.get(batch_id)
            task = asyncio.create_task(job.end(reason) if cancelled or reason else job.run())
            task.add_done_callback(functools.partial(self._ended, batch_id, job))
            self._jobs[batch_id] = (job, task)
        for batch_id, (job, task) in list(self._jobs.items()):
            if self.batches.storage.size(cancel_marker(batch_id)) is not None:
                job.cancel()
                if now - self._cancel_seen.setdefault(batch_id, now) > CANCEL_GRACE_S:
                    logger.warning("batch %s: its job did not stop within %gs of the cancel", batch_id, CANCEL_GRACE_S)
                    task.cancel()  # the next scan ends the batch, cancelled

    def _ended(self, batch_id: str, job: BatchJob, task: asyncio.Task[Batch]) -> None:
        self._jobs.pop(batch_id, None)
        self._cancel_seen.pop(batch_id, None)
        if task.cancelled():
            return
        failure = task.exception()
        if failure is None:
            if task.result().status in TERMINAL:
                self._final.add(batch_id)
            for tracked in (self._failures, self._retry_at, self._given_up):
                tracked.pop(batch_id, None)
            return
        # Tries in a row that finished no line: a job that moves on, however slowly, is never given up.
        failures = self._failures[batch_id] = 1 if job.lines_written else self._failures.get(batch_id, 0) + 1
        if failures >= JOB_TRIES and batch_id not in self._given_up:
            self._given_up[batch_id] = BatchError(
                code="runner_failed",
                message=f"The batch runner failed {failures} times in a row on this batch, no line finished "
                f"in between ({type(failure).__name__}); the batch runner's log has the details.",
            )
            delay = 0.0
        else:
            delay = min(RETRY_MAX_S, RETRY_BASE_S * 4.0 ** (failures - 1))
        self._retry_at[batch_id] = time.monotonic() + delay
        logger.error(
            "batch %s: its job failed (%d in a row); %s",
            batch_id,
            failures,
            "the batch fails" if delay == 0.0 else f"it is tried again in {delay:g}s",
            exc_info=failure,
        )

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
        logger.info("batch runner: storage %s, %d lines at once", config.storage_root, config.batches.max_concurrency)

    async def _send_line(self, batch_id: str, endpoint: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
        if self._ingress is None:
            app = serve.get_replica_context().app_name
            self._ingress = serve.get_deployment_handle(self._ingress_name, app_name=app)
        result: dict[str, Any] = await self._ingress.batch_line.remote(batch_id, endpoint, body, request_id)
        return result

    async def wake(self) -> None:
        """Look at the storage root now (a batch was created or cancelled)."""
        self._runtime.wake()

    async def check_health(self) -> None:
        if self._loop.done():
            raise RuntimeError("the batch runner's loop ended") from (
                None if self._loop.cancelled() else self._loop.exception()
            )

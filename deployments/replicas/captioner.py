"""VisionCaptioner: the GPU-pinned VLM that turns images into captions.

It runs as its own Serve application so that its failure never takes the main application down.
A load failure (OOM, missing weights, no hub) does not raise from the constructor: the replica
reports "unavailable" and why through `status` (state, model, cause, next attempt) and retries
loading in the background.

Weights that cannot be reached (`weights_unreachable`: no hub offline, a missing or empty
directory) are the expected offline case: one WARNING line per attempt, no traceback, and the
health check passes, so that Serve neither logs a traceback per check nor replaces the replica (each
replacement a new process importing torch): the replica's own retries load the weights once they
appear. Serve then shows the replica RUNNING (its process is up and answers); whether it can caption
is what `status`, /health and the ready line say: never ready until it has loaded. Any other load
error (a real crash) logs its traceback and fails the health check with the loader's words, so that
`serve status` and the Ray dashboard show the deployment UNHEALTHY and why, and Serve replaces the
replica at most once per `unhealthy_restart_s` until one loads (`serve_health`).

Images from concurrent requests are captioned together (`Batcher`): up to `max_batch_size` of
them go through the model in one forward pass; those that arrive while a batch runs form the next,
and an idle model waits at most `batch_wait_timeout_s` for company. Decoding and captioning run in
worker threads, so the event loop keeps queueing the next batch while one runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from huggingface_hub import try_to_load_from_cache
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.config import Lifecycle, ModelConfig
from deployments.engines import CaptionEngine, create_caption_engine
from deployments.engines.batcher import Batcher
from deployments.engines.images import decode_rgb
from deployments.errors import CaptionerUnavailable
from deployments.monitoring.metrics import CAPTIONER_METRICS, ENGINE_METRICS, Recorder
from deployments.protocol.replica import CaptionRequest, CaptionResult, ComponentStatus
from deployments.replicas.lifecycle import EngineSlot
from deployments.replicas.serve_health import own_deployment, startup_hold_s
from deployments.roles import Role

NOT_CONFIGURED = "no captioner configured (vision_mode is not proxy in models.yaml)"


def failure_kind(exc: Exception) -> str:
    """The `kind` tag of a failed caption request: the engine is not loaded, out of memory, or another error."""
    if isinstance(exc, CaptionerUnavailable):
        return "unavailable"
    return "oom" if "OutOfMemory" in type(exc).__name__ else "error"


def weights_unreachable(model: ModelConfig) -> Callable[[Exception], bool]:
    """Whether a load error of `model` means its weights cannot be reached (the expected offline
    case), not that they are broken: a local directory that is missing or holds no file at all, or
    a hub model whose config is not in the hub cache failing with an OSError (transformers' "couldn't
    connect to 'https://huggingface.co' ... couldn't find them in the cached files"). A corrupt file,
    an unknown architecture or an out-of-memory error is not expected."""

    def expected(exc: Exception) -> bool:
        if model.local_path:
            local = Path(model.source)
            return not local.is_dir() or not any(local.iterdir())
        return isinstance(exc, OSError) and not isinstance(try_to_load_from_cache(model.source, "config.json"), str)

    return expected


@serve.deployment  # its options are the builder's (deployments/options/)
class VisionCaptioner:
    def __init__(self, model: ModelConfig | None, lifecycle: Lifecycle, *others: DeploymentHandle) -> None:
        """`others`: the handles of the application's other captioners (`app.build_captioner_app`),
        unused: bound here only so that Serve deploys them with this one."""
        self._slot: EngineSlot[CaptionEngine] | None = None
        self._restart_s = lifecycle.unhealthy_restart_s
        self._started = False  # the first health check, Serve's at the replica's start, has run
        # The replica's recorder; a test or a benchmark may swap it for its own.
        self.metrics = Recorder(
            CAPTIONER_METRICS + ENGINE_METRICS, model.name if model else "none", tags={"role": Role.CAPTIONER}
        )
        self.metrics.export_zeros()
        self.batches: list[int] = []  # sizes of the last batches, for /health and tests
        captioning = model.captioning if model else None
        size, wait_s = (captioning.max_batch_size, captioning.batch_wait_timeout_s) if captioning else (1, 0.0)
        self._batcher: Batcher[tuple[bytes, str], str] = Batcher(self._caption_batch, size, wait_s)
        if model is not None:
            self._slot = EngineSlot(
                Role.CAPTIONER,
                model.name,
                lambda: create_caption_engine(model),
                unavailable=CaptionerUnavailable,
                lifecycle=lifecycle,
                sample=self._sample,
                expected=weights_unreachable(model),
            )
            self._slot.load()
            self._slot.start()

    async def caption(self, request: CaptionRequest) -> CaptionResult:
        """The captions, or (while the model is not loaded) why not; any other failure raises."""
        started = time.monotonic()
        try:
            if self._slot is None:
                raise CaptionerUnavailable(NOT_CONFIGURED)
            items = zip(request.images, request.prompts, strict=True)
            captions = list(await asyncio.gather(*(self._batcher.submit(item) for item in items)))
        except Exception as exc:
            self.metrics.inc("caption_failures", tags={"kind": failure_kind(exc)})
            if isinstance(exc, CaptionerUnavailable):
                return CaptionResult(unavailable=exc.message)
            raise
        self.metrics.observe("caption_latency_seconds", time.monotonic() - started)
        self.metrics.inc("images_captioned", len(captions))
        return CaptionResult(captions=captions)

    async def _caption_batch(self, items: list[tuple[bytes, str]]) -> list[str]:
        assert self._slot is not None
        async with self._slot.use() as engine:
            images = await asyncio.to_thread(lambda: [decode_rgb(data) for data, _ in items])
            captions = await asyncio.to_thread(engine.caption, images, [prompt for _, prompt in items])
        self.batches = [*self.batches[-99:], len(items)]
        self.metrics.observe("caption_batch_size", len(items))
        return captions

    def status(self) -> ComponentStatus:
        if self._slot is None:
            return ComponentStatus(ready=False, reason=NOT_CONFIGURED)
        status = self._slot.status()
        status.details["last_batch_sizes"] = self.batches[-10:]
        return status

    def _sample(self) -> None:
        assert self._slot is not None
        self.metrics.set("engine_loaded", float(self._slot.state == "ready"))

    async def check_health(self) -> None:
        """Raises `CaptionerUnavailable` with the loader's error while the model cannot load for an
        unexpected reason; passes while it loads, once it has loaded, while its weights cannot be
        reached (the replica retries; `status` says why), and without a captioner configured. At the
        replica's start it may first keep retrying the load, or pass anyway (`serve_health.startup_hold_s`)."""
        if self._slot is None or self._slot.error is None or self._slot.expected_failure:
            self._started = True
            return
        if not self._started:
            self._started = True
            hold_s = startup_hold_s(await asyncio.to_thread(own_deployment), self._restart_s)
            if hold_s is None:
                return
            deadline = time.monotonic() + hold_s
            while self._slot.error is not None and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
        if self._slot.error is not None:
            raise CaptionerUnavailable(f"captioner {self._slot.name!r} cannot load: {self._slot.error}")

    def __del__(self) -> None:
        if self._slot is not None:
            self._slot.stop()

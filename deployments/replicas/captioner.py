"""VisionCaptioner: the GPU-pinned VLM that turns images into captions.

It runs as its own Serve application so that its failure never takes the main application down.

A replica is RUNNING in Serve's view only with its model loaded: its constructor loads the model
and, while that fails (OOM, missing weights, no hub offline), retries in place with backoff
(`load_retry_s`, doubling up to 5 minutes) and does not return. So `serve status`, `serve.status()`
and the Ray dashboard show the deployment not HEALTHY (UPDATING, its replica STARTING; the
`vision` application DEPLOYING) for as long as it cannot caption, and HEALTHY once it has loaded,
with no replacement process and no health-check traceback: one log line per attempt, with the
cause and the next attempt's time (a WARNING without traceback when the weights cannot be reached,
the expected offline case; an ERROR with the traceback for any other failure). Ray Serve 2.60 lets
no replica set its deployment's status or message (its controller sets them from replica starts
and health checks only: `deployment_state.py`, `record_replica_startup_failure` and
`_stop_replica_mark_unhealthy_if_target_version`), so the cause is published on the load board
(`monitoring.load_board`), where the ingress reads it for /health, the ready line and degraded
answers. Failing the health check instead would show UNHEALTHY only by having Serve replace the
replica (a new process importing torch) with a traceback per failed check.

Once loaded, a model that fails to load again (after an idle unload) fails the health check, and
Serve replaces the replica; the replacement waits in its constructor as above.

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
from deployments.monitoring import load_board
from deployments.monitoring.metrics import CAPTIONER_METRICS, ENGINE_METRICS, Recorder
from deployments.protocol.replica import CaptionRequest, CaptionResult, ComponentStatus
from deployments.replicas.lifecycle import EngineSlot
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
    an unknown architecture or an out-of-memory error is not expected.
    """

    def expected(exc: Exception) -> bool:
        if model.local_path:
            local = Path(model.source)
            return not local.is_dir() or not any(local.iterdir())
        return isinstance(exc, OSError) and not isinstance(try_to_load_from_cache(model.source, "config.json"), str)

    return expected


@serve.deployment  # its options are the builder's (deployments/options/)
class VisionCaptioner:
    """The captioner deployment: one captioning model's replica, captioning images in batches."""

    def __init__(self, model: ModelConfig | None, lifecycle: Lifecycle, *others: DeploymentHandle) -> None:
        """`others`: the handles of the application's other captioners (`app.build_captioner_app`),
        unused: bound here only so that Serve deploys them with this one. Returns once the model has
        loaded (see the module's docstring).
        """
        self._slot: EngineSlot[CaptionEngine] | None = None
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
            board = load_board.this_replica()
            if self._slot.wait_loaded(lambda: board.publish(self.status()), load_board.REFRESH_S):
                board.clear()
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
        """Raises `CaptionerUnavailable` with the loader's error once a model that had loaded has
        failed to load again (after an idle unload): Serve then replaces the replica.
        """
        if self._slot is not None and self._slot.state == "failed":
            raise CaptionerUnavailable(f"captioner {self._slot.name!r} cannot load: {self._slot.error}")

    def __del__(self) -> None:
        if self._slot is not None:
            self._slot.stop()

"""The ingress's view of the captioner application: `Captioner`, what the request logic calls (the
fakes of tests/unit/ingress/fakes.py satisfy it too), and `CaptionerClient`, the caption cache in
front of it with a deadline on every call and a short memory of failures (why, and how a waiting
call watches Serve's view: docs/vision.md, "Graceful fallback").
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from ray import serve
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentResponse

from deployments.config import ModelConfig, ProxyVisionConfig
from deployments.errors import CaptionerTimeout, CaptionerUnavailable, from_serve, unwrap
from deployments.ingress.handles import CaptionerHandle
from deployments.ingress.media.cache import CacheStats
from deployments.ingress.serve_status import FAILED, DeploymentView, app_state, deployment_view
from deployments.ingress.vision.cache import CaptionCache, cache_key
from deployments.ingress.vision.collect import ImageInput
from deployments.monitoring import load_board
from deployments.monitoring.metrics import Recorder
from deployments.protocol.replica import CaptionRequest, CaptionResult, ComponentStatus
from deployments.roles import Role

logger = logging.getLogger("ray.serve")

STATUS_TIMEOUT_S = 5.0
WATCH_AFTER_S = 1.0  # also how often a waiting call looks at Serve's view


class Captioner(Protocol):
    """The captioner as the ingress sees it: captions (`pipeline.VisionPipeline`), its status and its caption
    cache's figures (`HealthService`).
    """

    @property
    def cache(self) -> CaptionCache: ...

    async def caption(self, images: list[ImageInput], stats: CacheStats | None = None) -> list[str]: ...

    async def status(self) -> ComponentStatus: ...


class CaptionerClient:
    """A captioner deployment behind its caption cache, a deadline on every call and a memory of failures."""

    def __init__(
        self,
        app: str,
        captioner: ModelConfig,
        vision: ProxyVisionConfig,
        metrics: Recorder | None = None,
        deployment: str = Role.CAPTIONER.deployment,
    ) -> None:
        """`app` and `deployment`: where the captioner runs; `metrics`: the ingress's, for the
        cache's size gauges.
        """
        self._app = app
        self._deployment = deployment
        self._metrics = metrics
        self._name = captioner.name
        self._captioning = captioner.captioning
        self._vision = vision
        self._down_until = 0.0
        self.reason: str | None = None
        self._last_reason: str | None = None  # the captioner's own last words on why it is not ready
        self._view: tuple[float, asyncio.Future[_View]] | None = None  # shared by waiting calls and /health
        self.cache = CaptionCache(vision.cache_entries, int(vision.cache_mb * 2**20))

    def _handle(self) -> CaptionerHandle:
        return serve.get_deployment_handle(self._deployment, app_name=self._app)

    def _mark_down(self, reason: str, error: type[CaptionerUnavailable] = CaptionerUnavailable) -> CaptionerUnavailable:
        if self.reason != reason:
            logger.warning("captioner unavailable, degrading image requests: %s", reason)
        self.reason = reason
        self._down_until = time.monotonic() + self._vision.retry_after_s
        return error(f"The vision captioner is unavailable: {reason}")

    def _mark_up(self) -> None:
        if self.reason is not None:
            logger.info("captioner is back")
        self.reason, self._down_until, self._last_reason = None, 0.0, None

    async def caption(self, images: list[ImageInput], stats: CacheStats | None = None) -> list[str]:
        """One caption per image, or `CaptionerUnavailable` (quickly, when it recently failed;
        `CaptionerTimeout` when this call waited out `timeout_s`). `stats` gets this call's cache hits.
        """
        prompts = [self._captioning.prompt(im.user_text) for im in images]
        keys = [cache_key(im.digest, self._name, prompt) for im, prompt in zip(images, prompts, strict=True)]

        async def missing(indices: list[int]) -> list[str]:
            return await self._call(
                CaptionRequest(images=[images[i].data for i in indices], prompts=[prompts[i] for i in indices])
            )

        try:
            return await self.cache.get_or_compute(keys, missing, stats)
        finally:
            if self._metrics is not None:  # its hits and misses: per request, in the access record
                self.cache.export(self._metrics, "caption_cache")

    async def _call(self, request: CaptionRequest) -> list[str]:
        if time.monotonic() < self._down_until:
            raise CaptionerUnavailable(f"The vision captioner is unavailable: {self.reason}")
        if self.reason is not None and (failed := _load_failure(*await self._serve_view())) is not None:
            raise self._mark_down(failed)  # still no replica: no call that would wait for one
        try:
            result = await self._watch(self._handle().caption.remote(request))
        except TimeoutError:
            reason = f"no answer within {self._vision.timeout_s:g}s ({await self._app_state()})"
            raise self._mark_down(reason, CaptionerTimeout) from None
        except Exception as exc:
            cause = unwrap(exc)
            if isinstance(cause, BackPressureError):  # busy, not broken: no degradation, the client retries
                raise from_serve(cause) from None
            if isinstance(cause, _ServeSaysDown):  # Serve's words: with the captioner's own last cause
                reason = self._with_known_cause(cause.message)
            elif isinstance(cause, _ReplicaSaysDown):  # the waiting replica's own words
                reason = cause.message
            else:
                reason = f"{type(cause).__name__}: {cause}"
            raise self._mark_down(reason[:500]) from None
        if result.unavailable is not None:  # the replica's own words (its loader's error)
            self._last_reason = result.unavailable[:500]
            raise self._mark_down(self._last_reason)
        self._mark_up()
        return result.captions

    async def _app_state(self) -> str:
        return await asyncio.to_thread(app_state, self._app, self._deployment)

    async def _watch(self, response: DeploymentResponse) -> CaptionResult:
        """The answer; `CaptionerUnavailable` once Serve reports the captioner unhealthy, or
        TimeoutError after `timeout_s`. Either way the call is cancelled.
        """
        deadline = time.monotonic() + self._vision.timeout_s
        call = asyncio.ensure_future(response)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                done, _ = await asyncio.wait({call}, timeout=min(WATCH_AFTER_S, left))
                if done:
                    return call.result()
                view, waiting = await self._serve_view()
                if view.status in FAILED:
                    raise _ServeSaysDown(view.words)
                if (failed := _load_failure(view, waiting)) is not None:
                    raise _ReplicaSaysDown(failed)
        finally:
            if not call.done():
                # Serve's response ends a cancelled call's task with RequestCancelledError, not as
                # cancelled: retrieve it, or every call given up logs "Task exception was never retrieved".
                call.add_done_callback(lambda task: task.cancelled() or task.exception())
                call.cancel()
                response.cancel()

    async def _serve_view(self) -> _View:
        """Serve's view of the captioner and, while no replica runs, a waiting replica's status from the
        load board; asked at most once per `WATCH_AFTER_S` however many calls (caption calls waiting,
        /health polls) want them.
        """
        now = time.monotonic()
        if self._view is None or now - self._view[0] >= WATCH_AFTER_S:
            self._view = (now, asyncio.ensure_future(asyncio.to_thread(_look, self._app, self._deployment)))
        return await asyncio.shield(self._view[1])

    def _with_known_cause(self, state: str) -> str:
        """Serve's words on the captioner, after the captioner's own last known cause (its loader's
        error, from a status or a caption call) when they do not already hold it: while Serve
        replaces a failing replica, its words are generic ("A replica's health check failed").
        """
        known = self._last_reason
        cause = (known or "").partition(" is not loaded (")[2].removesuffix(")") or known  # the loader's own words
        return state if not known or not cause or cause in state else f"{known} ({state})"

    async def status(self) -> ComponentStatus:
        view, waiting = await self._serve_view()
        if view.scaled_to_zero:  # any call, a status call too, makes Serve start a replica: idle stays idle
            return ComponentStatus(ready=True, model=self._name, details={"state": "scaled_to_zero", "replicas": 0})
        if waiting is not None:  # a replica waits for its model: its own words, and Serve's count of replicas
            if waiting.reason:
                self._last_reason = waiting.reason
            waiting.details["replicas"] = view.replicas
            return waiting
        if view.status != "UNKNOWN" and not view.running:
            # No replica can answer (one is loading, or Serve is replacing a failed one): a call would
            # wait out STATUS_TIMEOUT_S for nothing, and /health with it. Serve's words, at once.
            replicas = ", ".join(f"{n} {state}" for state, n in view.replicas.items()) or "none"
            reason = f"no replica running yet ({replicas}); {view.app_words}"
            if view.status in FAILED:
                state, reason = "failed", self._with_known_cause(reason)
            else:
                state = "loading"  # a first start, a redeploy or a scale-up: nothing has failed
            details = {"state": state, "replicas": view.replicas}
            return ComponentStatus(ready=False, model=self._name, reason=reason, details=details)
        try:
            status = await asyncio.wait_for(self._handle().status.remote(), STATUS_TIMEOUT_S)
        except Exception:  # no replica answers (one being replaced): Serve's words, with the last known cause
            reason = self._with_known_cause(await self._app_state())
            return ComponentStatus(ready=False, model=self._name, reason=reason, details={"state": "unavailable"})
        if status.ready:
            self._mark_up()
        elif status.reason:
            self._last_reason = status.reason
        return status


class _ServeSaysDown(CaptionerUnavailable):
    """Serve reports the captioner deployment failed while a call waits: Serve's words, not the replica's."""


class _ReplicaSaysDown(CaptionerUnavailable):
    """No replica runs, and a waiting one published that its model failed to load: its words."""


_View = tuple[DeploymentView, ComponentStatus | None]


def _look(app: str, deployment: str) -> _View:
    """Serve's view of the deployment and, when no replica of it runs, a waiting replica's status."""
    view = deployment_view(app, deployment)
    return view, (None if view.running else load_board.read(app, deployment))


def _load_failure(view: DeploymentView, waiting: ComponentStatus | None) -> str | None:
    """Why image requests cannot be captioned now, when no replica runs and a waiting one said its load failed."""
    if view.running or waiting is None or waiting.details.get("state") != "failed":
        return None
    return (waiting.reason or "the captioner's model failed to load")[:500]

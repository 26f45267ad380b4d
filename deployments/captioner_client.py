"""The ingress's view of the captioner application: the caption cache in front of it, deadlines
on every call, and a short memory of failures so that image requests degrade at once instead of
each waiting out a timeout.

Only images missing from the cache cross the handle, each once. After a failure, calls are
skipped for `retry_after_s` (cached captions are still served); the next call after that tries
again, so the service uses a recovered captioner without a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ray import serve
from ray.serve.exceptions import BackPressureError

from deployments.caption_cache import CaptionCache, cache_key
from deployments.config import VisionProxyConfig
from deployments.errors import CaptionerUnavailable, from_serve, unwrap
from deployments.protocol import CaptionRequest, ComponentStatus
from deployments.proxy_vision import ImageInput

logger = logging.getLogger("ray.serve")

DEPLOYMENT = "VisionCaptioner"
STATUS_TIMEOUT_S = 5.0


def _app_state(app: str) -> str:
    """Serve's own words on the captioner application (e.g. why a replica cannot be scheduled)."""
    try:
        status = serve.status().applications.get(app)
    except Exception as exc:
        return f"Serve status unavailable: {exc}"
    if status is None:
        return f"Serve application {app!r} is not deployed"
    detail = status.deployments.get(DEPLOYMENT)
    message = (detail.message if detail else "") or status.message
    return f"Serve application {app!r} is {getattr(status.status, 'value', status.status)}" + (
        f": {message}" if message else ""
    )


class CaptionerClient:
    def __init__(self, app: str, vision: VisionProxyConfig) -> None:
        self._app = app
        self._vision = vision
        self._down_until = 0.0
        self.reason: str | None = None
        self.cache = CaptionCache(vision.cache_entries, int(vision.cache_mb * 2**20))

    def _handle(self):
        return serve.get_deployment_handle(DEPLOYMENT, app_name=self._app)

    def _mark_down(self, reason: str) -> CaptionerUnavailable:
        if self.reason != reason:
            logger.warning("captioner unavailable, degrading image requests: %s", reason)
        self.reason = reason
        self._down_until = time.monotonic() + self._vision.retry_after_s
        return CaptionerUnavailable(f"The vision captioner is unavailable: {reason}")

    def _mark_up(self) -> None:
        if self.reason is not None:
            logger.info("captioner is back")
        self.reason, self._down_until = None, 0.0

    async def caption(self, images: list[ImageInput]) -> list[str]:
        """One caption per image, or `CaptionerUnavailable` (quickly, when it recently failed)."""
        prompts = [self._vision.prompt(im.user_text) for im in images]
        keys = [cache_key(im.digest, self._vision.model, prompt) for im, prompt in zip(images, prompts, strict=True)]

        async def missing(indices: list[int]) -> list[str]:
            return await self._call(
                CaptionRequest(images=[images[i].data for i in indices], prompts=[prompts[i] for i in indices])
            )

        return await self.cache.get_or_compute(keys, missing)

    async def _call(self, request: CaptionRequest) -> list[str]:
        if time.monotonic() < self._down_until:
            raise CaptionerUnavailable(f"The vision captioner is unavailable: {self.reason}")
        response = None
        try:
            response = self._handle().caption.remote(request)
            captions = await asyncio.wait_for(response, self._vision.timeout_s)
        except TimeoutError:
            if response is not None:
                response.cancel()
            reason = f"no answer within {self._vision.timeout_s:g}s ({await asyncio.to_thread(_app_state, self._app)})"
            raise self._mark_down(reason) from None
        except Exception as exc:
            cause = unwrap(exc)
            if isinstance(cause, BackPressureError):  # busy, not broken: no degradation, the client retries
                raise from_serve(cause) from None
            reason = cause.message if isinstance(cause, CaptionerUnavailable) else f"{type(cause).__name__}: {cause}"
            raise self._mark_down(reason[:500]) from None
        self._mark_up()
        return captions

    async def status(self) -> ComponentStatus:
        try:
            status = await asyncio.wait_for(self._handle().status.remote(), STATUS_TIMEOUT_S)
        except Exception:
            return ComponentStatus(ready=False, reason=await asyncio.to_thread(_app_state, self._app))
        if status.ready:
            self._mark_up()
        return status

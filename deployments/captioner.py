"""VisionCaptioner: the GPU-pinned VLM that turns images into captions.

It runs as its own Serve application so that its failure never takes the main application down.
A load failure (OOM, missing weights, no hub) does not raise: the replica stays up, reports
"unavailable" and why through `status`, and retries loading in the background.
"""

from __future__ import annotations

import asyncio

from ray import serve

from deployments.config import Lifecycle, ModelConfig, VisionProxyConfig
from deployments.engines import CaptionEngine, create_caption_engine
from deployments.engines.lifecycle import EngineSlot
from deployments.errors import CaptionerUnavailable
from deployments.images import decode_rgb
from deployments.protocol import CaptionRequest, ComponentStatus

NOT_CONFIGURED = "no captioner configured (vision_mode is not proxy in models.yaml)"


@serve.deployment(name="VisionCaptioner", max_ongoing_requests=32, health_check_period_s=10)
class VisionCaptioner:
    def __init__(self, model: ModelConfig | None, vision: VisionProxyConfig | None, lifecycle: Lifecycle) -> None:
        self._slot: EngineSlot[CaptionEngine] | None = None
        if model is not None:
            self._slot = EngineSlot(
                "captioner",
                model.name,
                lambda: create_caption_engine(model, vision),
                unavailable=CaptionerUnavailable,
                lifecycle=lifecycle,
            )
            self._slot.load()
            self._slot.start()

    async def caption(self, request: CaptionRequest) -> list[str]:
        if self._slot is None:
            raise CaptionerUnavailable(NOT_CONFIGURED)
        async with self._slot.use() as engine:
            images = await asyncio.to_thread(lambda: [decode_rgb(b) for b in request.images])
            return await asyncio.to_thread(engine.caption, images, request.prompts)

    def status(self) -> ComponentStatus:
        if self._slot is None:
            return ComponentStatus(ready=False, reason=NOT_CONFIGURED)
        return self._slot.status()

    def check_health(self) -> None:
        """Never raises for a degraded engine: Serve would restart the replica in a loop."""

    def __del__(self) -> None:
        if self._slot is not None:
            self._slot.stop()

"""The /health endpoint's logic: each component's own status, and Serve's view where a component
cannot answer. 200 while the decoder serves (``ok``, or ``degraded`` without the captioner), 503
(``unavailable``) when it does not.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ray.serve.exceptions import BackPressureError

from deployments.errors import unwrap
from deployments.ingress.handles import DecoderHandle
from deployments.ingress.serve_status import SERVING, deployment_view
from deployments.ingress.vision.client import Captioner
from deployments.protocol.replica import ComponentStatus

DECODER_STATUS_TIMEOUT_S = 5.0


class HealthService:
    """The /health report of one served model: its decoder's and its captioner's state."""

    def __init__(self, decoder: DecoderHandle, captioner: Captioner | None, *, model_name: str) -> None:
        """`decoder`: a handle to the decoder deployment; `captioner`: None without proxy vision."""
        self._decoder = decoder
        self._captioner = captioner
        self._model = model_name

    async def report(self) -> tuple[dict[str, Any], int]:
        """The /health body and its status code."""
        decoder, captioner = await asyncio.gather(self._decoder_status(), self._captioner_status())  # neither waits
        components: dict[str, Any] = {"decoder": decoder.model_dump()}
        ready = [decoder.ready]
        if captioner is not None:
            components["captioner"] = captioner
            ready.append(captioner["ready"])
        overall = "ok" if all(ready) else ("degraded" if decoder.ready else "unavailable")
        return {"status": overall, "components": components}, 200 if decoder.ready else 503

    async def _captioner_status(self) -> dict[str, Any] | None:
        if self._captioner is None:
            return None
        status = await self._captioner.status()
        return {**status.model_dump(), "cache": self._captioner.cache.describe()}

    async def _decoder_status(self) -> ComponentStatus:
        try:
            return await asyncio.wait_for(self._decoder.status.remote(), DECODER_STATUS_TIMEOUT_S)
        except Exception as exc:
            cause = unwrap(exc)
            if not isinstance(cause, TimeoutError | BackPressureError):
                return ComponentStatus(
                    ready=False, reason=f"decoder not reachable: {type(cause).__name__}: {cause}"[:500]
                )
        # Every replica is busy generating: the status call waits behind generation. Serve's own
        # health checks (which fail when the engine does) still say whether the decoder works.
        decoder = self._decoder
        view = await asyncio.to_thread(deployment_view, decoder.app_name, decoder.deployment_name)
        if view.status not in SERVING:
            return ComponentStatus(ready=False, model=self._model, reason=view.words)
        busy = f"no status answer within {DECODER_STATUS_TIMEOUT_S:g}s (replicas busy); {view.words}"
        return ComponentStatus(ready=True, model=self._model, details={"busy": busy})

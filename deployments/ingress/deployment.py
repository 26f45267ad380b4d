"""Ingress: the OpenAI-compatible HTTP router (CPU), as a Serve deployment.

Its constructor builds the request logic from its config and the decoder's handle (`ChatService`,
`HealthService`, the `CaptionerClient` of proxy vision); Serve then asks it for its ASGI app
(`__serve_build_asgi_app__`), which `api.build_api` makes for this replica's settings."""

from __future__ import annotations

import logging
import time

from fastapi import FastAPI
from pydantic import BaseModel
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.config import ImageInputConfig, ModelConfig, ProxyVisionConfig, ServerConfig
from deployments.ingress.api import build_api
from deployments.ingress.chat import ChatService
from deployments.ingress.completions import CompletionService
from deployments.ingress.guard import GuardSettings
from deployments.ingress.health import HealthService
from deployments.ingress.vision.client import CaptionerClient
from deployments.monitoring.metrics import INGRESS, Recorder
from deployments.protocol import ModelCard, ModelList

logger = logging.getLogger("ray.serve")


class IngressConfig(BaseModel):
    model_name: str
    captioner: ModelConfig | None = None  # proxy vision: the captioner and how to call it
    vision: ProxyVisionConfig | None = None
    captioner_app: str = "vision"
    native_max_images: int | None = None  # native vision: the primary's own image limit
    images: ImageInputConfig = ImageInputConfig()
    server: ServerConfig = ServerConfig()


@serve.deployment  # its options are the builder's (deployments/options.py)
@serve.ingress()
class Ingress:
    def __init__(self, config: IngressConfig, decoder: DeploymentHandle) -> None:
        self._metrics = Recorder(INGRESS, config.model_name)
        captioner = None
        if config.captioner is not None and config.vision is not None:
            captioner = CaptionerClient(config.captioner_app, config.captioner, config.vision, self._metrics)
        self._chat = ChatService(
            decoder,
            captioner,
            model_name=config.model_name,
            request_timeout_s=config.server.request_timeout_s,
            images=config.images,
            vision=config.vision,
            max_n=config.server.max_n,
            native_max_images=config.native_max_images,
        )
        self._completions = CompletionService(
            decoder,
            model_name=config.model_name,
            request_timeout_s=config.server.request_timeout_s,
            max_n=config.server.max_n,
        )
        self._health = HealthService(decoder, captioner, model_name=config.model_name)
        self._models = ModelList(data=[ModelCard(id=config.model_name, created=int(time.time()))])
        self._guard = GuardSettings.from_config(config.server)
        logger.info(
            "ingress for %r: %s, body cap %d bytes, request deadline %gs",
            config.model_name,
            f"{len(self._guard.keys)} API key(s) required" if self._guard.keys else "no API keys (open)",
            config.server.max_body_bytes,
            config.server.request_timeout_s,
        )

    def __serve_build_asgi_app__(self) -> FastAPI:
        return build_api(self._chat, self._completions, self._health, self._models, self._guard, self._metrics)

"""The composition root: the only place that binds deployments.

Two Serve applications, so that a captioner that cannot start (OOM, no weights, no GPU to
schedule on) never takes the main application out of RUNNING:

- `build_app(args)`: Ingress -> PrimaryDecoder (the main application, HTTP on /)
- `build_captioner_app(args)`: VisionCaptioner (found by the ingress by application name)

Both take the same args (see `AppArgs`), so serve_config.yaml can share one `args:` block.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray.serve import Application

from deployments.captioner import VisionCaptioner
from deployments.config import AppArgs, GpuShare, resolve_plan
from deployments.decoder import PrimaryDecoder
from deployments.ingress import Ingress, IngressConfig

logger = logging.getLogger("ray.serve")

SHARED_GPU = 0.5  # decoder and captioner packed on one card


def _gpus(share: GpuShare) -> float:
    """`auto`: half a GPU when the cluster has GPUs, else run on CPU."""
    if share != "auto":
        return float(share)
    has_gpu = ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0
    return SHARED_GPU if has_gpu else 0.0


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Main application: the OpenAI ingress and the primary decoder."""
    app_args = AppArgs.model_validate(args or {})
    plan = resolve_plan(app_args)
    gpus = _gpus(app_args.decoder_gpus)
    logger.info(
        "building main app: primary=%s vision=%s decoder_gpus=%s",
        plan.primary.name,
        plan.primary.capabilities.vision_mode,
        gpus,
    )
    decoder = PrimaryDecoder.options(ray_actor_options={"num_cpus": 1, "num_gpus": gpus}).bind(
        plan.primary, plan.lifecycle
    )
    config = IngressConfig(
        model_name=plan.primary.name,
        vision=plan.vision,
        captioner_app=plan.captioner_app,
        images=plan.images,
        server=plan.server,
    )
    return Ingress.options(ray_actor_options={"num_cpus": 0}).bind(config, decoder)


def build_captioner_app(args: dict[str, Any] | None = None) -> Application:
    """Captioner application. Without a proxy-vision captioner configured, it only reports so."""
    app_args = AppArgs.model_validate(args or {})
    plan = resolve_plan(app_args)
    gpus = _gpus(app_args.captioner_gpus) if plan.captioner else 0.0
    return VisionCaptioner.options(ray_actor_options={"num_cpus": 1, "num_gpus": gpus}).bind(
        plan.captioner, plan.vision, plan.lifecycle
    )

"""The composition root: the only place that binds deployments.

Two Serve applications, so that a captioner that cannot start (OOM, no weights, no GPU to
schedule on) never takes the main application out of RUNNING:

- `build_app(args)`: Ingress -> PrimaryDecoder (the main application, HTTP on /)
- `build_captioner_app(args)`: VisionCaptioner (found by the ingress by application name)

Both take the same args (see `AppArgs`), so serve_config.yaml can share one `args:` block. Every
deployment's Serve options come from `options`, here.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.serve import Application

from deployments.config import cpu_cores, parse_args, resolve_plan
from deployments.ingress.deployment import Ingress, IngressConfig
from deployments.options import INGRESS, captioner_options, decoder_options, for_replicas
from deployments.replicas.captioner import VisionCaptioner
from deployments.replicas.decoder import PrimaryDecoder

logger = logging.getLogger("ray.serve")


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Main application: the OpenAI ingress and the primary decoder."""
    app_args = parse_args(args)
    plan = resolve_plan(app_args)
    options, primary = decoder_options(app_args, plan.primary, cpu_cores())
    logger.info(
        "building main app: primary=%s vision=%s decoder=%s cpu_threads=%s",
        primary.name,
        primary.capabilities.vision_mode,
        options,
        primary.params.cpu_threads,
    )
    deadline = plan.server.request_timeout_s  # a replacement waits for the requests in flight
    decoder = PrimaryDecoder.options(**for_replicas(PrimaryDecoder.name, options, drain_s=deadline)).bind(
        primary, plan.lifecycle
    )
    config = IngressConfig(
        model_name=primary.name,
        captioner=plan.captioner,
        vision=plan.vision,
        captioner_app=plan.captioner_app,
        images=plan.images,
        server=plan.server,
    )
    return Ingress.options(**for_replicas(Ingress.name, INGRESS, drain_s=deadline)).bind(config, decoder)


def build_captioner_app(args: dict[str, Any] | None = None) -> Application:
    """Captioner application. Without a proxy-vision captioner configured, it only reports so."""
    app_args = parse_args(args)
    plan = resolve_plan(app_args)
    options = for_replicas(
        VisionCaptioner.name, captioner_options(app_args, plan.captioner), drain_s=plan.proxy_vision.timeout_s
    )
    return VisionCaptioner.options(**options).bind(plan.captioner, plan.lifecycle)

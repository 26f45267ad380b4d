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

from deployments.config import AppArgs, GpuShare, ModelConfig, resolve_plan
from deployments.engines.loading import cpu_cores
from deployments.ingress.deployment import Ingress, IngressConfig
from deployments.replicas.captioner import VisionCaptioner
from deployments.replicas.decoder import PrimaryDecoder

logger = logging.getLogger("ray.serve")

SHARED_GPU = 0.5  # decoder and captioner packed on one card
CPU_DECODERS = 2  # decoder replicas on a CPU-only machine with 2+ cores (decoder_cpu_replicas: auto)


def _gpus(share: GpuShare) -> float:
    """`auto`: half a GPU when the cluster has GPUs, else run on CPU."""
    if share != "auto":
        return float(share)
    has_gpu = ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0
    return SHARED_GPU if has_gpu else 0.0


def decoder_layout(app_args: AppArgs, model: ModelConfig, cores: int) -> tuple[dict[str, Any], ModelConfig]:
    """The decoder's Serve options, and its model config with the torch threads each replica uses.

    GPU: `decoder_gpus` per replica, from one replica up to two when batches are full
    (target: max_num_seqs ongoing requests); loading a model is slow, so scaling waits 30 s up and
    600 s down. CPU: a fixed number of replicas, and with `cpu_threads: all` each gets an equal
    share of the `cores`: two processes run the engine's Python step loop and no OpenMP barrier
    spans them (1.4x one replica with both cores, docs/benchmarks.md). Together they ask Ray for
    one CPU, as one decoder did, so that the captioner keeps its own.
    An `autoscaling_config` in serve_config.yaml replaces both (a `num_replicas` there is ignored
    on GPUs, where the builder's autoscaling wins).
    """
    if gpus := _gpus(app_args.decoder_gpus):
        scaling = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": model.params.max_num_seqs}
        scaling |= {"upscale_delay_s": 30, "downscale_delay_s": 600}
        return {"ray_actor_options": {"num_cpus": 1, "num_gpus": gpus}, "autoscaling_config": scaling}, model
    wanted = app_args.decoder_cpu_replicas
    replicas = min(CPU_DECODERS, cores) if wanted == "auto" else wanted
    if model.params.cpu_threads == "all":
        params = model.params.model_copy(update={"cpu_threads": max(1, cores // replicas)})
        model = model.model_copy(update={"params": params})
    return {"ray_actor_options": {"num_cpus": 1 / replicas, "num_gpus": 0}, "num_replicas": replicas}, model


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Main application: the OpenAI ingress and the primary decoder."""
    app_args = AppArgs.model_validate(args or {})
    plan = resolve_plan(app_args)
    options, primary = decoder_layout(app_args, plan.primary, cpu_cores())
    logger.info(
        "building main app: primary=%s vision=%s decoder=%s cpu_threads=%s",
        primary.name,
        primary.capabilities.vision_mode,
        options,
        primary.params.cpu_threads,
    )
    decoder = PrimaryDecoder.options(**options).bind(primary, plan.lifecycle)
    config = IngressConfig(
        model_name=primary.name,
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

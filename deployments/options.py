"""The Serve options of every deployment: set here, by the builder, from the configuration.

The deployment classes carry none, so that tests and production run with the same limits. A
model's ``deployment:`` section in models.yaml sets its queue bounds; `serve_config.yaml` may still
override any option (Serve applies its ``deployments:`` entries over these).

- Ingress: a cheap async router, autoscaled on open connections, with no CPU reserved.
- PrimaryDecoder: placed by `decoder_layout` (GPU autoscaling, or a fixed set of CPU replicas
  sharing the cores); it takes up to twice `max_num_seqs` requests (one batch running, one
  waiting in the replica) and never fewer than `max_num_seqs`.
- VisionCaptioner: one CPU and a GPU share, autoscaled on ongoing captioning calls; without a GPU
  share, one replica (a second on the same cores adds no throughput, and when decoder replicas
  crash it can take the CPU their replacements need: measured, a 5-minute decoder outage in the
  soak, docs/reliability.md). With no captioner configured, one CPU replica that only says so,
  behind the same queue bounds.

Every queue is bounded: beyond `max_queued_requests`, callers get a 503 with Retry-After at once,
and a crashed model replica is noticed (and replaced) within `HEALTH_CHECK_S`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ray

from deployments.config import AppArgs, DeploymentConfig, GpuShare, ModelConfig
from deployments.errors import ConfigError

SHARED_GPU = 0.5  # decoder and captioner packed on one card
CPU_DECODERS = 2  # decoder replicas on a CPU-only machine with 2+ cores (decoder_cpu_replicas: auto)
HEALTH_CHECK_S = 2
BACKPRESSURE = {"retry_after_s": 2}
QUEUED = 64

INGRESS: dict[str, Any] = {
    "max_ongoing_requests": 256,
    "max_queued_requests": 512,
    "backpressure_config": BACKPRESSURE,
    "autoscaling_config": {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 64},
    "ray_actor_options": {"num_cpus": 0},
}
CAPTIONER_ONGOING = 16
CAPTIONER_SCALING = {
    "min_replicas": 1,
    "max_replicas": 2,
    "target_ongoing_requests": 4,
    "upscale_delay_s": 30,
    "downscale_delay_s": 600,
}


def gpus(share: GpuShare) -> float:
    """`auto`: half a GPU when the cluster has GPUs, else run on CPU."""
    if share != "auto":
        return float(share)
    has_gpu = ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0
    return SHARED_GPU if has_gpu else 0.0


def decoder_layout(app_args: AppArgs, model: ModelConfig, cores: int) -> tuple[dict[str, Any], ModelConfig]:
    """The decoder's placement options, and its model config with the torch threads each replica uses.

    GPU: `decoder_gpus` per replica, from one replica up to two when batches are full
    (target: max_num_seqs ongoing requests); loading a model is slow, so scaling waits 30 s up and
    600 s down. CPU: a fixed number of replicas, and with `cpu_threads: all` each gets an equal
    share of the `cores`: two processes run the engine's Python step loop and no OpenMP barrier
    spans them (1.4x one replica with both cores, docs/benchmarks.md). Together they ask Ray for
    one CPU, as one decoder did, so that the captioner keeps its own.
    An `autoscaling_config` in serve_config.yaml replaces both (a `num_replicas` there is ignored
    on GPUs, where the builder's autoscaling wins).
    """
    if share := gpus(app_args.decoder_gpus):
        scaling = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": model.params.max_num_seqs}
        scaling |= {"upscale_delay_s": 30, "downscale_delay_s": 600}
        return {"ray_actor_options": {"num_cpus": 1, "num_gpus": share}, "autoscaling_config": scaling}, model
    wanted = app_args.decoder_cpu_replicas
    replicas = min(CPU_DECODERS, cores) if wanted == "auto" else wanted
    if model.params.cpu_threads == "all":
        params = model.params.model_copy(update={"cpu_threads": max(1, cores // replicas)})
        model = model.model_copy(update={"params": params})
    return {"ray_actor_options": {"num_cpus": 1 / replicas, "num_gpus": 0}, "num_replicas": replicas}, model


def _queue(deployment: DeploymentConfig, ongoing: int) -> dict[str, Any]:
    """Bounded queues: a model's `deployment:` section, else `ongoing` and `QUEUED`."""
    return {
        "max_ongoing_requests": deployment.max_ongoing_requests or ongoing,
        "max_queued_requests": deployment.max_queued_requests or QUEUED,
        "backpressure_config": BACKPRESSURE,
        "health_check_period_s": HEALTH_CHECK_S,
    }


def decoder_options(app_args: AppArgs, model: ModelConfig, cores: int) -> tuple[dict[str, Any], ModelConfig]:
    """All of the decoder's options (`decoder_layout` and its queue), and its placed model config.
    `ConfigError` when a replica would take fewer requests than one batch holds."""
    seqs = model.params.max_num_seqs
    queue = _queue(model.deployment, 2 * seqs)
    if queue["max_ongoing_requests"] < seqs:
        raise ConfigError(
            f"{Path(app_args.models_file).resolve()}: model {model.name!r}: deployment.max_ongoing_requests "
            f"({queue['max_ongoing_requests']}) is below params.max_num_seqs ({seqs}): a replica would never fill "
            "its batch; raise the first or lower the second"
        )
    layout, placed = decoder_layout(app_args, model, cores)
    return {**queue, **layout}, placed


def captioner_options(app_args: AppArgs, model: ModelConfig | None) -> dict[str, Any]:
    """The captioner's options; without a captioner configured, one replica that only says so,
    behind the same bounded queue."""
    if model is None:
        return {**_queue(DeploymentConfig(), CAPTIONER_ONGOING), "ray_actor_options": {"num_cpus": 1, "num_gpus": 0.0}}
    share = gpus(app_args.captioner_gpus)
    scaling = {"autoscaling_config": CAPTIONER_SCALING} if share else {"num_replicas": 1}
    return {
        **_queue(model.deployment, CAPTIONER_ONGOING),
        **scaling,
        "ray_actor_options": {"num_cpus": 1, "num_gpus": share},
    }

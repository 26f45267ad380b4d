"""Queues and autoscaling: every deployment's queue bounds (a model's `deployment:` section, else
its role's defaults) and Serve's `autoscaling_config` from a model's `deployment.autoscaling`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deployments.config import AppArgs, AutoscalingConfig, DeploymentConfig, ModelConfig
from deployments.errors import ConfigError

HEALTH_CHECK_S = 2
BACKPRESSURE = {"retry_after_s": 2}
QUEUED = 64

INGRESS_OPTIONS: dict[str, Any] = {
    "max_ongoing_requests": 256,
    "max_queued_requests": 512,
    "backpressure_config": BACKPRESSURE,
    "autoscaling_config": {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 64},
    "ray_actor_options": {"num_cpus": 0},
}
BATCH_RUNNER_OPTIONS: dict[str, Any] = {
    "num_replicas": 1,  # one writer of each batch's record and files
    "max_ongoing_requests": 64,
    "ray_actor_options": {"num_cpus": 0},
}
CAPTIONER_ONGOING = 16
GPU_DECODERS = 2  # default max_replicas of a decoder on GPUs
GPU_CAPTIONERS = 2  # default max_replicas of a captioner with a GPU share (1 on CPU)
CAPTIONER_TARGET = 4  # default target_ongoing_requests of a captioner
EMBEDDER_ONGOING = 64  # requests one embedding replica takes (each a few inputs, batched across requests)
EMBEDDER_TARGET = 16  # default target_ongoing_requests of an autoscaled embedding model
GPU_EMBEDDERS = 2  # default max_replicas of an embedding model with a GPU share (1 on CPU)


def refuse(app_args: AppArgs, model: ModelConfig, problem: str) -> ConfigError:
    """A `ConfigError` that names the models file and the model."""
    return ConfigError(f"{Path(app_args.models_file).resolve()}: model {model.name!r}: {problem}")


def scaling(app_args: AppArgs, model: ModelConfig, *, max_replicas: int, target: float, role: str) -> dict[str, Any]:
    """Serve's `autoscaling_config` from the model's `deployment.autoscaling` (the defaults when it
    has none), its unset fields filled with the role's `max_replicas` and `target`; `ConfigError`
    when the filled-in bounds contradict each other.
    """
    config = model.deployment.autoscaling or AutoscalingConfig()
    result: dict[str, Any] = {
        "min_replicas": config.min_replicas,
        "max_replicas": config.max_replicas or max_replicas,
        "target_ongoing_requests": config.target_ongoing_requests or target,
        "upscale_delay_s": config.upscale_delay_s,
        "downscale_delay_s": config.downscale_delay_s,
        "look_back_period_s": config.look_back_period_s,
        "metrics_interval_s": config.metrics_interval_s,
    }
    if config.initial_replicas is not None:
        result["initial_replicas"] = config.initial_replicas
    if config.downscale_to_zero_delay_s is not None:
        result["downscale_to_zero_delay_s"] = config.downscale_to_zero_delay_s
    top = result["max_replicas"]
    for name in ("min_replicas", "initial_replicas"):
        if result.get(name, 0) > top:
            raise refuse(
                app_args,
                model,
                f"deployment.autoscaling.{name} ({result[name]}) is above max_replicas ({top}, the default for "
                f"a {role}): set deployment.autoscaling.max_replicas",
            )
    return result


def queue_bounds(deployment: DeploymentConfig, ongoing: int) -> dict[str, Any]:
    """Bounded queues: a model's `deployment:` section, else `ongoing` and `QUEUED`."""
    return {
        "max_ongoing_requests": deployment.max_ongoing_requests or ongoing,
        "max_queued_requests": deployment.max_queued_requests or QUEUED,
        "backpressure_config": BACKPRESSURE,
        "health_check_period_s": HEALTH_CHECK_S,
    }

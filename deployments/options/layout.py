"""Placement: where each model's replicas run (GPU shares, or CPU replicas sharing the cores and
their threads, by the engine's spec), with their engine resolved from it, and the decoder's and the
captioner's whole options (placement and queue).
"""

from __future__ import annotations

from typing import Any

import ray

from deployments.config import AppArgs, DeploymentConfig, GpuShare, ModelConfig
from deployments.engines import registry
from deployments.engines.registry import check_settings, engine_spec
from deployments.errors import ConfigError
from deployments.options.routing import decoder_routing
from deployments.options.scaling import (
    CAPTIONER_ONGOING,
    CAPTIONER_TARGET,
    EMBEDDER_ONGOING,
    EMBEDDER_TARGET,
    GPU_CAPTIONERS,
    GPU_DECODERS,
    GPU_EMBEDDERS,
    queue_bounds,
    refuse,
    scaling,
)

SHARED_GPU = 0.5  # decoder and captioner packed on one card


def model_gpus(model: ModelConfig, default: GpuShare) -> float:
    """GPUs per replica of `model`: its `deployment.num_gpus`, else the builder arg's `default`."""
    share = model.deployment.num_gpus
    return gpus(default if share is None else share)


def gpus(share: GpuShare) -> float:
    """`auto`: half a GPU when the cluster has GPUs, else run on CPU."""
    if share != "auto":
        return float(share)
    has_gpu = ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0
    return SHARED_GPU if has_gpu else 0.0


def cpu_decoders(model: ModelConfig) -> int:
    """CPU replicas of a decoder under `decoder_cpu_replicas: auto` (before the cores cap them), by its
    resolved engine's spec (`EngineSpec.cpu_replicas`): one for llama.cpp, which batches its slots in
    one process over all the cores it is given; `CPU_DECODERS` for the torch engines, whose Python
    step loop no OpenMP barrier spans (1.4x one replica with both cores, docs/benchmarks.md).
    """
    return engine_spec(model.engine).cpu_replicas


def decoder_layout(
    app_args: AppArgs, model: ModelConfig, cores: int, cpus: float = 1.0
) -> tuple[dict[str, Any], ModelConfig]:
    """The decoder's placement options, and its placed model config: its engine resolved (`engine:
    auto`: llama.cpp for a GGUF without a GPU share, `registry.resolved`) and the threads each
    replica computes with.

    GPU: `decoder_gpus` per replica, autoscaled (by default from one replica up to two when batches
    are full, target max_num_seqs ongoing requests; loading a model is slow, so scaling waits 30 s
    up and 600 s down). CPU: a fixed number of replicas (`decoder_cpu_replicas`; auto: `cpu_decoders`,
    one for llama.cpp, two for the torch engines), each with an equal share of the `cores` under
    `cpu_threads: all` (and, for llama.cpp, under an unset cpu_threads too: its threads are its
    cores). Together they ask Ray for `cpus` CPUs (one, as one decoder did, so that the captioner
    keeps its own; with several primaries, each decoder gets its part of the cores and of that CPU).

    CPU with `deployment.autoscaling`: between min_replicas and max_replicas (default the replicas
    above) replicas, each with the fixed share a replica has at the maximum:
    `cores // max_replicas` threads under `cpu_threads: all`, and cpus / max_replicas of a Ray CPU
    (one CPU at the maximum, as above). A replica's threads never change with the count, so
    replicas never oversubscribe the cores, and fewer replicas leave cores idle rather than
    restart with more threads. A max_replicas above the cores is refused (a replica needs a core).
    The decoder is the service, so it never scales to zero.

    An `autoscaling_config` in serve_config.yaml replaces the builder's (a `num_replicas` there is
    ignored where the builder autoscales).
    """
    configured = model.deployment.autoscaling
    if configured is not None and configured.min_replicas == 0:
        raise refuse(
            app_args,
            model,
            "deployment.autoscaling.min_replicas is 0, but the decoder answers every request: "
            "it needs at least one replica (only a captioner may scale to zero)",
        )
    share = model_gpus(model, app_args.decoder_gpus)
    model = resolved(app_args, model, on_cpu=not share)
    if share:
        autoscaling = scaling(
            app_args, model, max_replicas=GPU_DECODERS, target=model.params.max_num_seqs, role="GPU decoder"
        )
        return {"ray_actor_options": {"num_cpus": 1, "num_gpus": share}, "autoscaling_config": autoscaling}, model
    wanted = app_args.decoder_cpu_replicas
    replicas = min(cpu_decoders(model), cores) if wanted == "auto" else wanted
    count: dict[str, Any] = {"num_replicas": replicas}
    if configured is not None:
        autoscaling = scaling(
            app_args, model, max_replicas=replicas, target=model.params.max_num_seqs, role="CPU decoder"
        )
        replicas = autoscaling["max_replicas"]
        if replicas > cores:
            raise refuse(
                app_args,
                model,
                f"deployment.autoscaling.max_replicas ({replicas}) is above the {cores} cores of this machine: "
                "each CPU decoder replica needs at least one core (its threads are cores // max_replicas)",
            )
        count = {"autoscaling_config": autoscaling}
    share = max(1, cores // replicas)
    threads, batch = model.params.cpu_threads, model.params.cpu_threads_batch
    update: dict[str, Any] = {"cpu_threads_batch": share} if batch == "all" else {}
    if threads == "all" or (threads is None and engine_spec(model.engine).threads_are_cores):
        update["cpu_threads"] = share
    if update:
        model = model.model_copy(update={"params": model.params.model_copy(update=update)})
    return {"ray_actor_options": {"num_cpus": cpus / replicas, "num_gpus": 0}, **count}, model


def decoder_options(
    app_args: AppArgs, model: ModelConfig, cores: int, cpus: float = 1.0
) -> tuple[dict[str, Any], ModelConfig]:
    """All of the decoder's options (`decoder_layout` on `cores` and `cpus`, its queue and its request
    router, `routing.decoder_routing`), and its placed model config.
    `ConfigError` when a replica would take fewer requests than one batch holds, or when its
    autoscaling cannot work (see `scaling`, `decoder_layout`).
    """
    seqs = model.params.max_num_seqs
    # With keys' limits, requests wait in the replica, where the keys share the queue fairly
    # (`engines.admission`), not in Serve's queue in front of it, first come first served.
    queue = queue_bounds(model.deployment, (4 if app_args.limits_file else 2) * seqs)
    if queue["max_ongoing_requests"] < seqs:
        raise refuse(
            app_args,
            model,
            f"deployment.max_ongoing_requests ({queue['max_ongoing_requests']}) is below params.max_num_seqs "
            f"({seqs}): a replica would never fill its batch; raise the first or lower the second",
        )
    layout, placed = decoder_layout(app_args, model, cores, cpus)
    return {**queue, **layout, **decoder_routing(placed)}, placed


def placed_captioner(app_args: AppArgs, model: ModelConfig) -> ModelConfig:
    """The captioner's model config with its `engine: auto` resolved from its GPU share (as
    `decoder_layout` does for a decoder): llama.cpp for a GGUF captioner without one.
    """
    return resolved(app_args, model, on_cpu=not model_gpus(model, app_args.captioner_gpus))


def captioner_options(app_args: AppArgs, model: ModelConfig | None) -> dict[str, Any]:
    """The captioner's options; without a captioner configured, one replica that only says so,
    behind the same bounded queue. With a GPU share it autoscales (1 to 2 replicas on 4 ongoing
    calls by default); on CPU it is one replica unless its `deployment.autoscaling` is given
    (then 1 replica at most by default: `{min_replicas: 0}` scales it to zero when idle).
    """
    if model is None:
        return {
            **queue_bounds(DeploymentConfig(), CAPTIONER_ONGOING),
            "ray_actor_options": {"num_cpus": 1, "num_gpus": 0.0},
        }
    share = model_gpus(model, app_args.captioner_gpus)
    count: dict[str, Any] = {"num_replicas": 1}
    if share or model.deployment.autoscaling is not None:
        top = GPU_CAPTIONERS if share else 1
        count = {
            "autoscaling_config": scaling(app_args, model, max_replicas=top, target=CAPTIONER_TARGET, role="captioner")
        }
    return {
        **queue_bounds(model.deployment, CAPTIONER_ONGOING),
        **count,
        "ray_actor_options": {"num_cpus": 1, "num_gpus": share},
    }


def embedder_options(app_args: AppArgs, model: ModelConfig) -> tuple[dict[str, Any], ModelConfig]:
    """An embedding model's options and its placed config (`engine: auto` resolved from its GPU share).
    With a GPU share it autoscales (1 to `GPU_EMBEDDERS` replicas, each kept near two full batches
    ongoing); on CPU it is one replica that reserves no Ray CPU (like the ingress: it shares the cores
    with the decoder instead of keeping a core from it; its threads are `params.cpu_threads`) unless
    its `deployment.autoscaling` says otherwise. A replica takes up to `EMBEDDER_ONGOING` requests.
    """
    share = model_gpus(model, app_args.embedder_gpus)
    model = resolved(app_args, model, on_cpu=not share)
    count: dict[str, Any] = {"num_replicas": 1}
    if share or model.deployment.autoscaling is not None:
        top = GPU_EMBEDDERS if share else 1
        count = {
            "autoscaling_config": scaling(app_args, model, max_replicas=top, target=EMBEDDER_TARGET, role="embedder")
        }
    options = {
        **queue_bounds(model.deployment, EMBEDDER_ONGOING),
        **count,
        "ray_actor_options": {"num_cpus": 1 if share else 0, "num_gpus": share},
    }
    return options, model


def resolved(app_args: AppArgs, model: ModelConfig, *, on_cpu: bool) -> ModelConfig:
    """The entry with `engine: auto` resolved from its placement (`on_cpu`: no GPU share), refused
    when it sets a setting that its engine does not read (`registry.check_settings`).
    """
    placed = registry.resolved(model, on_cpu=on_cpu)
    try:
        check_settings(model, placed.engine)
    except ConfigError as exc:
        raise refuse(app_args, model, str(exc)) from None
    return placed

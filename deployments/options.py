"""The Serve options of every deployment: set here, by the builder, from the configuration.

The deployment classes carry none, so that tests and production run with the same limits. A
model's ``deployment:`` section in models.yaml sets its queue bounds; `serve_config.yaml` may still
override any option (Serve applies its ``deployments:`` entries over these).

- Ingress: a cheap async router, autoscaled on open connections, with no CPU reserved.
Several primaries (models.yaml `primaries`) get a decoder each, named by `deployment_name`, their
GPU share from `model_gpus`; on CPU `build_app` gives each its part of the cores and of the CPU.

- PrimaryDecoder: placed by `decoder_layout` (GPU autoscaling, or a set of CPU replicas sharing
  the cores: fixed, or autoscaled when the model's `deployment.autoscaling` is given), which also
  resolves its `engine: auto` from that placement (`ModelConfig.resolved`); it takes up
  to twice `max_num_seqs` requests (one batch running, one waiting in the replica) and never fewer
  than `max_num_seqs`.
- VisionCaptioner: one CPU and a GPU share, autoscaled on ongoing captioning calls, its `engine:
  auto` resolved from that share (`placed_captioner`); without a GPU share, one replica (a second
  on the same cores adds no throughput, and when decoder replicas crash it can take the CPU their
  replacements need: measured, a 5-minute decoder outage in the soak, docs/reliability.md) unless
  `deployment.autoscaling` says otherwise (e.g. `min_replicas: 0`, scale to zero). With no
  captioner configured, one CPU replica that only says so, behind the same queue bounds.

Autoscaling (`scaling`): a model's `deployment.autoscaling` (`AutoscalingConfig`) becomes Serve's
`autoscaling_config`, its unset fields filled with the defaults of the model's role, which are
what the builder used before the section existed: so without the section nothing changes.

Every queue is bounded: beyond `max_queued_requests`, callers get a 503 with Retry-After at once,
and a crashed model replica is noticed (and replaced) within `HEALTH_CHECK_S`.

Replica processes (`for_replicas`, applied last to every deployment): the environment variables they
need (`REPLICA_ENV`), merged under the application's runtime_env, and a graceful shutdown as long as
a call's deadline, so that a redeploy or a downscale lets requests in flight finish.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import ray

from deployments.config import AppArgs, AutoscalingConfig, DeploymentConfig, GpuShare, ModelConfig
from deployments.engines.registry import engine_replica_env, engine_spec
from deployments.errors import ConfigError
from deployments.roles import Role

SHARED_GPU = 0.5  # decoder and captioner packed on one card
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
CAPTIONER_ONGOING = 16
GPU_DECODERS = 2  # default max_replicas of a decoder on GPUs
GPU_CAPTIONERS = 2  # default max_replicas of a captioner with a GPU share (1 on CPU)
CAPTIONER_TARGET = 4  # default target_ongoing_requests of a captioner


def deployment_name(role: Role, model: ModelConfig | None, several: bool) -> str:
    """The role's deployment name alone when the application has one deployment of that role, else
    with the model's name (characters outside ``[A-Za-z0-9._-]`` become ``-``: the name is in
    replica actor and log file names, and Serve reserves ``#``)."""
    if not several or model is None:
        return role.deployment
    return f"{role.deployment}-{re.sub(r'[^A-Za-z0-9._-]', '-', model.name)}"


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


def _refuse(app_args: AppArgs, model: ModelConfig, problem: str) -> ConfigError:
    return ConfigError(f"{Path(app_args.models_file).resolve()}: model {model.name!r}: {problem}")


def scaling(app_args: AppArgs, model: ModelConfig, *, max_replicas: int, target: float, role: str) -> dict[str, Any]:
    """Serve's `autoscaling_config` from the model's `deployment.autoscaling` (the defaults when it
    has none), its unset fields filled with the role's `max_replicas` and `target`; `ConfigError`
    when the filled-in bounds contradict each other."""
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
            raise _refuse(
                app_args,
                model,
                f"deployment.autoscaling.{name} ({result[name]}) is above max_replicas ({top}, the default for "
                f"a {role}): set deployment.autoscaling.max_replicas",
            )
    return result


def cpu_decoders(model: ModelConfig) -> int:
    """CPU replicas of a decoder under `decoder_cpu_replicas: auto` (before the cores cap them), by its
    resolved engine's spec (`EngineSpec.cpu_replicas`): one for llama.cpp, which batches its slots in
    one process over all the cores it is given; `CPU_DECODERS` for the torch engines, whose Python
    step loop no OpenMP barrier spans (1.4x one replica with both cores, docs/benchmarks.md)."""
    return engine_spec(model.engine).cpu_replicas


def decoder_layout(
    app_args: AppArgs, model: ModelConfig, cores: int, cpus: float = 1.0
) -> tuple[dict[str, Any], ModelConfig]:
    """The decoder's placement options, and its placed model config: its engine resolved (`engine:
    auto`: llama.cpp for a GGUF without a GPU share, `ModelConfig.resolved`) and the threads each
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
        raise _refuse(
            app_args,
            model,
            "deployment.autoscaling.min_replicas is 0, but the decoder answers every request: "
            "it needs at least one replica (only a captioner may scale to zero)",
        )
    share = model_gpus(model, app_args.decoder_gpus)
    model = model.resolved(on_cpu=not share)
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
            raise _refuse(
                app_args,
                model,
                f"deployment.autoscaling.max_replicas ({replicas}) is above the {cores} cores of this machine: "
                "each CPU decoder replica needs at least one core (its threads are cores // max_replicas)",
            )
        count = {"autoscaling_config": autoscaling}
    threads = model.params.cpu_threads
    if threads == "all" or (threads is None and engine_spec(model.engine).threads_are_cores):
        params = model.params.model_copy(update={"cpu_threads": max(1, cores // replicas)})
        model = model.model_copy(update={"params": params})
    return {"ray_actor_options": {"num_cpus": cpus / replicas, "num_gpus": 0}, **count}, model


def _queue(deployment: DeploymentConfig, ongoing: int) -> dict[str, Any]:
    """Bounded queues: a model's `deployment:` section, else `ongoing` and `QUEUED`."""
    return {
        "max_ongoing_requests": deployment.max_ongoing_requests or ongoing,
        "max_queued_requests": deployment.max_queued_requests or QUEUED,
        "backpressure_config": BACKPRESSURE,
        "health_check_period_s": HEALTH_CHECK_S,
    }


def decoder_options(
    app_args: AppArgs, model: ModelConfig, cores: int, cpus: float = 1.0
) -> tuple[dict[str, Any], ModelConfig]:
    """All of the decoder's options (`decoder_layout` on `cores` and `cpus`, and its queue), and its
    placed model config.
    `ConfigError` when a replica would take fewer requests than one batch holds, or when its
    autoscaling cannot work (see `scaling`, `decoder_layout`)."""
    seqs = model.params.max_num_seqs
    queue = _queue(model.deployment, 2 * seqs)
    if queue["max_ongoing_requests"] < seqs:
        raise _refuse(
            app_args,
            model,
            f"deployment.max_ongoing_requests ({queue['max_ongoing_requests']}) is below params.max_num_seqs "
            f"({seqs}): a replica would never fill its batch; raise the first or lower the second",
        )
    layout, placed = decoder_layout(app_args, model, cores, cpus)
    return {**queue, **layout}, placed


def placed_captioner(app_args: AppArgs, model: ModelConfig) -> ModelConfig:
    """The captioner's model config with its `engine: auto` resolved from its GPU share (as
    `decoder_layout` does for a decoder): llama.cpp for a GGUF captioner without one."""
    return model.resolved(on_cpu=not model_gpus(model, app_args.captioner_gpus))


def captioner_options(app_args: AppArgs, model: ModelConfig | None) -> dict[str, Any]:
    """The captioner's options; without a captioner configured, one replica that only says so,
    behind the same bounded queue. With a GPU share it autoscales (1 to 2 replicas on 4 ongoing
    calls by default); on CPU it is one replica unless its `deployment.autoscaling` is given
    (then 1 replica at most by default: `{min_replicas: 0}` scales it to zero when idle)."""
    if model is None:
        return {**_queue(DeploymentConfig(), CAPTIONER_ONGOING), "ray_actor_options": {"num_cpus": 1, "num_gpus": 0.0}}
    share = model_gpus(model, app_args.captioner_gpus)
    count: dict[str, Any] = {"num_replicas": 1}
    if share or model.deployment.autoscaling is not None:
        top = GPU_CAPTIONERS if share else 1
        count = {
            "autoscaling_config": scaling(app_args, model, max_replicas=top, target=CAPTIONER_TARGET, role="captioner")
        }
    return {
        **_queue(model.deployment, CAPTIONER_ONGOING),
        **count,
        "ray_actor_options": {"num_cpus": 1, "num_gpus": share},
    }


# --- Replica processes: environment and draining --------------------------------------------------
# Kept apart from the placement above: every deployment's options pass through `for_replicas` last.

# Variables a replica's process must have when it starts (read by libgomp, oneDNN and Serve at import):
# the engines' (`engine_replica_env`: OpenMP's brief spin, bounded oneDNN caches) where one runs, and
# replica code on the replica's own event loop where it streams: one thread hop less for every
# streamed chunk (both deployments keep their blocking work in worker threads).
SAME_LOOP = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}
REPLICA_ENV: dict[str, dict[str, str]] = {
    "Ingress": SAME_LOOP,
    "PrimaryDecoder": {**engine_replica_env(), **SAME_LOOP},
    "VisionCaptioner": engine_replica_env(),
}
DRAIN_MARGIN_S = 5.0  # beyond a request's own deadline: its error event, the cancellation reaching the engine


def application_runtime_env() -> dict[str, Any]:
    """The runtime_env this builder runs under: the application's (serve_config.yaml's `runtime_env`,
    which Serve gives the build task), or `serve run`'s job's; empty before Ray is initialized (`serve
    run module:app` calls the builder first)."""
    if not ray.is_initialized():
        return {}
    return dict(ray.get_runtime_context().runtime_env or {})


def for_replicas(
    deployment: str, options: dict[str, Any], *, drain_s: float, inherited: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`options` with what the deployment's replica processes need:

    - `REPLICA_ENV[deployment]` in `ray_actor_options.runtime_env.env_vars`, under the application's
      runtime_env (`inherited`; by default `application_runtime_env()`). Serve gives a deployment that
      sets a runtime_env nothing of the application's but its working_dir, so the builder copies the
      application's runtime_env in whole and lays its own variables under the application's: a
      variable set in serve_config.yaml wins, and none is lost.
    - `graceful_shutdown_timeout_s`: `drain_s` (the deadline of a call to the deployment) plus
      `DRAIN_MARGIN_S`. A replica that Serve replaces (a redeploy, a downscale) takes no new requests
      and finishes those it has for up to this long before it is killed; Serve's default, 20 s, cut
      streams off mid-answer.
    """
    runtime_env = dict(application_runtime_env() if inherited is None else inherited)
    runtime_env["env_vars"] = {**REPLICA_ENV[deployment], **(runtime_env.get("env_vars") or {})}
    actor = {**options.get("ray_actor_options", {}), "runtime_env": runtime_env}
    return {**options, "ray_actor_options": actor, "graceful_shutdown_timeout_s": drain_s + DRAIN_MARGIN_S}

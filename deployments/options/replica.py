"""Replica processes: the environment variables they need (`REPLICA_ENV`), merged under the
application's runtime_env, and a graceful shutdown as long as a call's deadline, so that a redeploy
or a downscale lets requests in flight finish. Every deployment's options pass through
`for_replicas` last.
"""

from __future__ import annotations

from typing import Any

import ray

from deployments.engines.registry import engine_replica_env

# Variables a replica's process must have when it starts (read by libgomp, oneDNN and Serve at import):
# the engines' (`engine_replica_env`: OpenMP's brief spin, bounded oneDNN caches) where one runs, and
# replica code on the replica's own event loop where it streams: one thread hop less for every
# streamed chunk (both deployments keep their blocking work in worker threads).
SAME_LOOP = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}
REPLICA_ENV: dict[str, dict[str, str]] = {
    "Ingress": SAME_LOOP,
    "PrimaryDecoder": {**engine_replica_env(), **SAME_LOOP},
    "VisionCaptioner": engine_replica_env(),
    "TextEmbedder": engine_replica_env(),
    "BatchRunner": {},
}
DRAIN_MARGIN_S = 5.0  # beyond a request's own deadline: its error event, the cancellation reaching the engine


def application_runtime_env() -> dict[str, Any]:
    """The runtime_env this builder runs under: the application's (serve_config.yaml's `runtime_env`,
    which Serve gives the build task), or `serve run`'s job's; empty before Ray is initialized (`serve
    run module:app` calls the builder first).
    """
    if not ray.is_initialized():
        return {}
    return dict(ray.get_runtime_context().runtime_env or {})


def for_replicas(
    deployment: str, options: dict[str, Any], *, drain_s: float, inherited: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`options` with what the deployment's replica processes need.

    That is:

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

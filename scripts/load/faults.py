"""Faults for the load test: replicas of a deployment killed through Ray at a set time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

import psutil

from deployments.roles import Role

TARGETS = {"decoder": ("default", Role.DECODER.deployment), "captioner": ("vision", Role.CAPTIONER.deployment)}


@dataclass
class Fault:
    target: str
    at_s: float
    killed: list[str] = field(default_factory=list)
    error: str | None = None


def connect_ray(port: int, address: str | None) -> str:
    """Join the Ray cluster whose Serve listens on `port` (other clusters on this machine are left alone)."""
    import ray
    from ray._private.services import find_gcs_addresses

    for candidate in [address] if address else sorted(find_gcs_addresses()) or ["auto"]:
        ray.init(address=candidate, namespace="serve", log_to_driver=False, logging_level=logging.ERROR)
        try:
            controller = ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
            if ray.get(controller.get_http_config.remote(), timeout=30).port == port:  # type: ignore[attr-defined]
                return candidate
        except Exception:  # no Serve there
            pass
        ray.shutdown()
    raise SystemExit(f"no Ray cluster here runs Serve on port {port}; pass --ray-address")


def gcs_address(pid: int) -> str | None:
    """The GCS address of the Ray cluster a process started (its raylet and workers carry it)."""
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            flags = [a.split("=", 1)[1] for a in child.cmdline() if a.startswith("--gcs-address=")]
            if flags:
                return flags[0]
    return None


def kill_replicas(app: str, deployment: str) -> list[str]:
    import ray

    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    actors = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]
    for actor in actors:
        ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
    return [a["name"] for a in actors]


async def inject(faults: list[Fault], t0: float, finished: asyncio.Event) -> None:
    for fault in faults:
        try:
            await asyncio.wait_for(finished.wait(), max(0.0, t0 + fault.at_s - time.monotonic()))
            fault.error = "not injected: the load had ended"
        except TimeoutError:
            try:
                fault.killed = await asyncio.to_thread(kill_replicas, *TARGETS[fault.target])
            except Exception as exc:
                fault.error = f"{type(exc).__name__}: {exc}"[:300]

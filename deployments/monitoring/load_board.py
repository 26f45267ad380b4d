"""Where a replica that is waiting for its model says why, while no call can reach it.

Ray Serve routes calls only to RUNNING replicas, and a replica runs once its constructor has
returned. A captioner's constructor returns only once its model has loaded (`VisionCaptioner`), so
that Serve's own status (`serve status`, the Ray dashboard) never calls a replica that cannot caption
HEALTHY. Meanwhile it publishes its status here: one key per replica in Ray's cluster-wide key-value
store (the GCS's, where Serve keeps its own checkpoints), refreshed every `REFRESH_S` while it waits
and deleted once the model has loaded. The ingress reads a deployment's freshest entry for /health,
the ready line and degraded answers, and ignores an entry not refreshed for `STALE_S` (its replica
was stopped or died while waiting).

Neither side ever raises for the board: what cannot be written or read is logged and skipped.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Protocol

from ray import serve
from ray.experimental import internal_kv

from deployments.protocol.replica import ComponentStatus

logger = logging.getLogger("ray.serve")

NAMESPACE = "mmserve"
REFRESH_S = 5.0
STALE_S = 20.0


class LoadBoard(Protocol):
    """Where a waiting replica publishes its status (`ReplicaBoard`; tests use their own)."""

    def publish(self, status: ComponentStatus) -> None: ...

    def clear(self) -> None: ...


def _prefix(app: str, deployment: str) -> str:
    return f"load/{app}/{deployment}/"


class ReplicaBoard:
    """One replica's entry on the board."""

    def __init__(self, app: str, deployment: str, replica: str) -> None:
        self.key = _prefix(app, deployment) + replica

    def publish(self, status: ComponentStatus) -> None:
        entry = json.dumps({"at": time.time(), "status": status.model_dump(mode="json")})
        try:
            internal_kv._internal_kv_put(self.key, entry, namespace=NAMESPACE)
        except Exception as exc:
            logger.debug("load board: cannot publish %s: %s", self.key, exc)

    def clear(self) -> None:
        try:
            internal_kv._internal_kv_del(self.key, namespace=NAMESPACE)
        except Exception as exc:
            logger.debug("load board: cannot clear %s: %s", self.key, exc)


class NoBoard:
    """Outside a Serve replica (a test, a script): nowhere to publish."""

    def publish(self, status: ComponentStatus) -> None:
        pass

    def clear(self) -> None:
        pass


def this_replica() -> LoadBoard:
    """The calling replica's entry; `NoBoard` outside Serve."""
    try:
        context = serve.get_replica_context()
    except Exception:
        return NoBoard()
    return ReplicaBoard(context.app_name, context.deployment, context.replica_id.unique_id)


def read(app: str, deployment: str, now: float | None = None) -> ComponentStatus | None:
    """The freshest status a waiting replica of `deployment` published within `STALE_S`; None if none."""
    now = time.time() if now is None else now
    freshest: tuple[float, ComponentStatus] | None = None
    try:
        for key in internal_kv._internal_kv_list(_prefix(app, deployment), namespace=NAMESPACE):
            raw = internal_kv._internal_kv_get(key, namespace=NAMESPACE)
            if not raw:
                continue
            entry = json.loads(raw)
            at = float(entry["at"])
            if now - at <= STALE_S and (freshest is None or at > freshest[0]):
                freshest = (at, ComponentStatus.model_validate(entry["status"]))
    except Exception as exc:
        logger.debug("load board: cannot read %s/%s: %s", app, deployment, exc)
        return None
    return None if freshest is None else freshest[1]

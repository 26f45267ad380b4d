"""How a captioner that cannot load shows in Serve's own status (`serve status`, the Ray dashboard's
Serve page, `serve.status()`), and how it turns healthy again by itself.

Ray 2.60 writes a deployment's status and message in its controller only, and only when a replica
fails to start or fails its health checks: no replica can set them. So the captioner's
`check_health` raises while its model cannot load, and Serve's own rules do the rest:

- a running replica that fails 3 health checks in a row (`health_check_period_s` apart) is stopped
  and replaced; the deployment turns UNHEALTHY ("A replica's health check failed") until a
  replacement starts;
- a replacement whose initial health check raises has failed to start: Serve puts the traceback
  (the loader's own words last) in the deployment's message and starts another at once, for as
  long as it takes, once a replica of this version has run. Before that, 3 such failures end it:
  DEPLOY_FAILED, and no replica is started again until the next deploy;
- a replacement that loads passes: the deployment is HEALTHY again, with no one's help.

`startup_hold_s` decides, from Serve's view when a replica starts, what its initial health check
does after a failed load: pass unless the deployment is already UNHEALTHY (a first deploy, a
redeploy, a scale-up from zero: Serve may not have seen a replica of this version run, and then
failing would be final); fail at once (Serve shows no reason yet); or keep retrying the load for
`unhealthy_restart_s` and then fail (Serve already shows the reason: this spaces the restarts).
"""

from __future__ import annotations

from dataclasses import dataclass

from ray import serve

START_FAILED = "failed to start"  # in both of Serve's messages on replicas that failed to start


@dataclass(frozen=True)
class ServeView:
    """Serve's status of one deployment: the words `serve status` shows."""

    status: str
    message: str = ""


def own_deployment() -> ServeView | None:
    """Serve's status of the calling replica's deployment; None when Serve cannot tell."""
    try:
        context = serve.get_replica_context()
        deployment = serve.status().applications[context.app_name].deployments[context.deployment]
    except Exception:
        return None
    return ServeView(str(getattr(deployment.status, "value", deployment.status)), deployment.message or "")


def startup_hold_s(view: ServeView | None, restart_s: float) -> float | None:
    """How long a starting replica whose model failed to load keeps retrying before its initial
    health check fails; None: it passes (and its later health checks fail)."""
    if view is None or view.status != "UNHEALTHY":
        return None  # Serve has not seen it fail: it may not have seen a replica of this version run
    return restart_s if START_FAILED in view.message else 0.0

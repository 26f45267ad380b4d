"""Serve's own view of a deployment (the controller's state), for when asking the deployment
itself cannot help: its replica died, is being replaced, or is too busy to answer a status call."""

from __future__ import annotations

from ray import serve

SERVING = {"HEALTHY", "UPSCALING", "DOWNSCALING"}
# Neither: UPDATING (a first start, or a redeploy while old replicas serve) and UNKNOWN.
FAILED = {"UNHEALTHY", "DEPLOY_FAILED"}


def _value(status: object) -> str:
    return str(getattr(status, "value", status))


def app_state(app: str, deployment: str) -> str:
    """Serve's words on an application and one of its deployments (e.g. why it cannot be scheduled)."""
    try:
        status = serve.status().applications.get(app)
    except Exception as exc:
        return f"Serve status unavailable: {exc}"
    if status is None:
        return f"Serve application {app!r} is not deployed"
    detail = status.deployments.get(deployment)
    message = (detail.message if detail else "") or status.message
    return f"Serve application {app!r} is {_value(status.status)}" + (f": {message}" if message else "")


def deployment_status(app: str, deployment: str) -> tuple[str, str]:
    """(status, Serve's words on it); the status is "UNKNOWN" when Serve cannot tell."""
    try:
        detail = serve.status().applications[app].deployments[deployment]
    except Exception as exc:
        return "UNKNOWN", f"Serve's status of {deployment} is unavailable: {type(exc).__name__}: {exc}"
    status = _value(detail.status)
    return status, f"Serve reports {deployment} {status}" + (f": {detail.message}" if detail.message else "")

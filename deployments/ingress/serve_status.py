"""Serve's own view of a deployment (the controller's state), for when asking the deployment
itself cannot help: its replica died, is being replaced, or is too busy to answer a status call."""

from __future__ import annotations

import re

from ray import serve
from ray.serve.schema import DeploymentStatusOverview

SERVING = {"HEALTHY", "UPSCALING", "DOWNSCALING"}
# Neither: UPDATING (a first start, or a redeploy while old replicas serve) and UNKNOWN.
FAILED = {"UNHEALTHY", "DEPLOY_FAILED"}
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours the replica's name in a traceback
TRACE_STARTS = ("Traceback (most recent call last)", "ray::", "ray.exceptions.")


def _value(status: object) -> str:
    return str(getattr(status, "value", status))


def brief(message: str) -> str:
    """Serve's message on one line, a replica's traceback in it cut to the exception at its end
    (a captioner that cannot load fails its start with the loader's words: `replicas.serve_health`)."""
    lines = ANSI.sub("", message).splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    if frames:
        first = next(i for i, line in enumerate(lines) if i == frames[0] or line.startswith(TRACE_STARTS))
        tail = lines[frames[-1] + 1 :]
        while tail and tail[0][:1].isspace():  # the last frame's code line and its ^^^ markers
            tail = tail[1:]
        lines = [*lines[:first], *tail]
    return " ".join(line.strip() for line in lines if line.strip())


def app_state(app: str, deployment: str) -> str:
    """Serve's words on an application and one of its deployments (e.g. why it cannot be scheduled)."""
    try:
        status = serve.status().applications.get(app)
    except Exception as exc:
        return f"Serve status unavailable: {exc}"
    if status is None:
        return f"Serve application {app!r} is not deployed"
    detail = status.deployments.get(deployment)
    message = brief((detail.message if detail else "") or status.message)
    return f"Serve application {app!r} is {_value(status.status)}" + (f": {message}" if message else "")


def _detail(app: str, deployment: str) -> DeploymentStatusOverview:
    """The controller's status of one deployment (raises when Serve cannot tell)."""
    return serve.status().applications[app].deployments[deployment]


def deployment_status(app: str, deployment: str) -> tuple[str, str]:
    """(status, Serve's words on it); the status is "UNKNOWN" when Serve cannot tell."""
    try:
        detail = _detail(app, deployment)
    except Exception as exc:
        return "UNKNOWN", f"Serve's status of {deployment} is unavailable: {type(exc).__name__}: {exc}"
    status = _value(detail.status)
    message = brief(detail.message)
    return status, f"Serve reports {deployment} {status}" + (f": {message}" if message else "")


def scaled_to_zero(app: str, deployment: str) -> bool:
    """Serve shows the deployment healthy with no replica at all (idle, at min_replicas 0)."""
    try:
        detail = _detail(app, deployment)
    except Exception:
        return False
    return _value(detail.status) == "HEALTHY" and not any(detail.replica_states.values())

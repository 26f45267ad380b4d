"""Serve's own view of a deployment (the controller's state), for when asking the deployment
itself cannot help: its replica died, is being replaced, or is too busy to answer a status call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ray import serve
from ray.serve.schema import ApplicationStatusOverview

SERVING = {"HEALTHY", "UPSCALING", "DOWNSCALING"}
# Neither: UPDATING (a first start, or a redeploy while old replicas serve) and UNKNOWN.
FAILED = {"UNHEALTHY", "DEPLOY_FAILED"}
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours the replica's name in a traceback
TRACE_STARTS = ("Traceback (most recent call last)", "ray::", "ray.exceptions.")


def _value(status: object) -> str:
    return str(getattr(status, "value", status))


def brief(message: str) -> str:
    """Serve's message on one line, a replica's traceback in it cut to the exception at its end (a
    replica that failed its start or its health check: Serve's message ends with the exception).
    """
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
        application = serve.status().applications.get(app)
    except Exception as exc:
        return f"Serve status unavailable: {exc}"
    return _app_words(app, application, deployment)


def _app_words(app: str, application: ApplicationStatusOverview | None, deployment: str) -> str:
    if application is None:
        return f"Serve application {app!r} is not deployed"
    detail = application.deployments.get(deployment)
    message = brief((detail.message if detail else "") or application.message)
    return f"Serve application {app!r} is {_value(application.status)}" + (f": {message}" if message else "")


@dataclass(frozen=True)
class DeploymentView:
    """Serve's status of one deployment at one moment: "UNKNOWN" when Serve cannot tell."""

    status: str
    words: str  # Serve's words on it, for a reason
    replicas: dict[str, int] = field(default_factory=dict)  # replicas by state: RUNNING, STARTING, ...
    app_words: str = ""  # `app_state`'s words, from the same moment: they say why a replica is not scheduled

    @property
    def running(self) -> int:
        """Replicas that a handle call can reach now; the others are starting, stopping or being replaced."""
        return self.replicas.get("RUNNING", 0)

    @property
    def scaled_to_zero(self) -> bool:
        """Healthy with no replica at all (idle, at min_replicas 0)."""
        return self.status == "HEALTHY" and not any(self.replicas.values())


def deployment_view(app: str, deployment: str) -> DeploymentView:
    """Serve's view of `deployment` in application `app`; UNKNOWN, with the reason, when Serve cannot say."""
    try:
        application = serve.status().applications[app]
        detail = application.deployments[deployment]
    except Exception as exc:
        return DeploymentView("UNKNOWN", f"Serve's status of {deployment} is unavailable: {type(exc).__name__}: {exc}")
    status = _value(detail.status)
    message = brief(detail.message)
    words = f"Serve reports {deployment} {status}" + (f": {message}" if message else "")
    replicas = {_value(state): n for state, n in detail.replica_states.items() if n}
    return DeploymentView(status, words, replicas, _app_words(app, application, deployment))

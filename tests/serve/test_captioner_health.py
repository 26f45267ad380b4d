"""The captioner's state where users monitor it. While its model cannot load for a real reason
(its weights are broken: here a config.json that is not JSON; weights that are only missing are the
quiet offline case, `tests/unit/replicas/test_captioner.py`), Serve's own status shows the vision
deployment UNHEALTHY with the loader's error; that is what `serve status` prints and the Ray
dashboard's Serve page draws, both from the controller's `serve.status()`. The main application
stays RUNNING and answers text, image requests degrade, and Serve replaces the failing replica at
most once per `unhealthy_restart_s`. Once good weights appear, a replica loads them and Serve shows
the deployment HEALTHY again, with no one's help."""

import itertools
import re
import shutil
import time
from datetime import datetime
from pathlib import Path

import pytest
import ray
from ray import serve

from tests.conftest import data_url, png_bytes
from tests.serve.conftest import app_status, deploy, echo_with_captioner, image_chat, undeploy, wait_until, write_models

RESTART_S = 8  # unhealthy_restart_s (the shipped 60 makes this module slow)


@pytest.fixture(scope="module")
def weights_dir(serve_cluster, tmp_path_factory):
    weights = tmp_path_factory.mktemp("captioner-health-weights")  # exists, but holds no model yet
    (weights / "config.json").write_text("{not json")  # a broken model, not merely absent ones
    return weights


@pytest.fixture(scope="module")
def service(weights_dir, tmp_path_factory):
    models = write_models(
        tmp_path_factory.mktemp("captioner-health"),
        echo_with_captioner(weights_dir, max_new_tokens=6),
        load_retry_s=1,
        unhealthy_restart_s=RESTART_S,
        proxy_vision={"timeout_s": 20, "retry_after_s": 0.5},
    )
    started = time.monotonic()
    deploy(models)
    yield started
    undeploy("default", "vision")


def captioner() -> tuple[str, str]:
    """Serve's status of the captioner deployment and its message, as `serve status` shows them."""
    deployment = serve.status().applications["vision"].deployments["VisionCaptioner"]
    return str(getattr(deployment.status, "value", deployment.status)), deployment.message


def replica_starts() -> list[float]:
    """When each captioner replica of this session started: the time stamp of its log's first line
    (a file's ctime is its last write, which a replica that keeps retrying its load moves on)."""
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs" / "serve"
    starts = []
    for path in logs.glob("replica_vision_VisionCaptioner_*.log"):
        with path.open() as log:
            stamp = re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", log.readline())
        if stamp:
            starts.append(datetime.strptime(stamp.group(), "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return sorted(starts)


def test_unhealthy_with_the_loaders_error(service, weights_dir, http):
    assert wait_until(lambda: captioner()[0] == "UNHEALTHY", timeout_s=60), captioner()
    print(f"\nUNHEALTHY {time.monotonic() - service:.1f}s after the deploy began")
    assert wait_until(lambda: "cannot load" in captioner()[1], timeout_s=60), captioner()
    print(f"the loader's error in Serve's message {time.monotonic() - service:.1f}s after the deploy began")
    status, message = captioner()
    print(f"Serve's message:\n{message}")
    assert status == "UNHEALTHY" and str(weights_dir) in message, message
    assert app_status("vision") != "RUNNING"
    assert app_status("default") == "RUNNING"
    text = http.post("/v1/chat/completions", json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]})
    assert text.status_code == 200 and text.json()["choices"][0]["message"]["content"] == "user: hi"
    image = http.post("/v1/chat/completions", json=image_chat("echo", data_url(png_bytes())))
    assert image.status_code == 200 and image.headers["x-vision-degraded"] == "captioner-unavailable"
    health = http.get("/health").json()
    assert health["status"] == "degraded" and not health["components"]["captioner"]["ready"]
    reason = health["components"]["captioner"]["reason"]  # the replica's, or Serve's cut to the loader's words
    print(f"/health's reason: {reason}")
    assert "cannot load" in reason and "Traceback" not in reason, reason


def test_stays_unhealthy_and_restarts_no_faster_than_unhealthy_restart_s(service):
    seen = set()
    assert wait_until(lambda: len(replica_starts()) >= 4, timeout_s=6 * RESTART_S + 60), replica_starts()
    deadline = time.monotonic() + RESTART_S
    while time.monotonic() < deadline:  # never HEALTHY in between: no flapping on the dashboard
        seen.add(captioner()[0])
        time.sleep(0.5)
    assert seen == {"UNHEALTHY"}, seen
    starts = replica_starts()
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    print(f"\nreplica starts, s apart: {[round(g, 1) for g in gaps]}")
    # The first replica passes its start (a failure then would end the deployment), its first
    # replacement fails at once so that the reason shows; from then on, one per RESTART_S at most.
    assert all(gap >= RESTART_S for gap in gaps[2:]), gaps


def test_health_answers_from_serves_view_while_no_replica_runs(service, http):
    """While a replacement loads (Serve shows it STARTING), no replica can answer a status call: /health
    answers from Serve's view at once, with the loader's words, instead of waiting out a timeout first."""

    seen: list[dict] = []

    def answered_from_serves_view() -> bool:
        seen.append(http.get("/health").json()["components"]["captioner"])
        return "replicas" in seen[-1]["details"]

    assert wait_until(answered_from_serves_view, timeout_s=60), seen
    answer = seen[-1]
    print(f"\n/health's captioner while no replica runs: {answer['details']} {answer['reason']}")
    assert not answer["ready"] and "RUNNING" not in answer["details"]["replicas"], answer
    assert "cannot load" in answer["reason"] and "Serve application 'vision' is UNHEALTHY" in answer["reason"], answer


def test_healthy_again_once_the_weights_appear(service, weights_dir, tiny_vlm_dir, http):
    for item in tiny_vlm_dir.iterdir():
        shutil.copy(item, weights_dir / item.name)
    copied = time.monotonic()
    assert wait_until(lambda: captioner()[0] == "HEALTHY", timeout_s=RESTART_S + 120), captioner()
    print(f"\nHEALTHY {time.monotonic() - copied:.1f}s after the weights appeared")
    assert app_status("vision") == "RUNNING"
    assert wait_until(
        lambda: (
            "x-vision-degraded"
            not in http.post("/v1/chat/completions", json=image_chat("echo", data_url(png_bytes()))).headers
        ),
        timeout_s=30,
    )
    assert http.get("/health").json()["status"] == "ok"

"""Graceful fallback: a captioner that cannot load (its weights are missing) never takes the main
application down; image requests degrade (or are rejected, by policy), /health says why, Serve's own
status (what `serve status` prints and the Ray dashboard draws) never calls it HEALTHY, and the
service uses the captioner again, without a restart of any replica, once it can load."""

import json
import re
import shutil
import time
from datetime import datetime
from pathlib import Path

import pytest
import ray
from ray import serve

from deployments.ingress.media.unseen import unseen_marker
from tests.conftest import data_url, png_bytes
from tests.serve.conftest import (
    app_status,
    deploy,
    echo_with_captioner,
    image_chat,
    undeploy,
    wait_until,
    write_models,
)


@pytest.fixture(scope="module")
def weights_dir(serve_cluster, tmp_path_factory):
    return tmp_path_factory.mktemp("captioner-weights")  # exists, but holds no model yet


@pytest.fixture(scope="module")
def models_file(weights_dir, tmp_path_factory):
    return write_models(
        tmp_path_factory.mktemp("fallback"),
        echo_with_captioner(weights_dir, max_new_tokens=6),
        load_retry_s=1,
        proxy_vision={"timeout_s": 20, "retry_after_s": 0.5},
    )


@pytest.fixture(scope="module")
def service(models_file):
    deployed = time.time()
    deploy(models_file)  # returns once the captioner's replica has said its load failed
    yield deployed
    undeploy("default", "vision", "strict")


def captioner_in_serve() -> tuple[str, dict[str, int]]:
    """Serve's status of the captioner deployment and its replicas by state, as `serve status` shows them."""
    deployment = serve.status().applications["vision"].deployments["VisionCaptioner"]
    states = {getattr(k, "value", str(k)): n for k, n in deployment.replica_states.items() if n}
    return str(getattr(deployment.status, "value", deployment.status)), states


def replica_starts(since: float) -> list[float]:
    """When each captioner replica started after `since`: the time stamp of its log's first line."""
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs" / "serve"
    starts = []
    for path in logs.glob("replica_vision_VisionCaptioner_*.log"):
        with path.open() as log:
            stamp = re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", log.readline())
        if stamp and (start := datetime.strptime(stamp.group(), "%Y-%m-%d %H:%M:%S,%f").timestamp()) >= since - 1:
            starts.append(start)
    return sorted(starts)


def test_main_application_stays_running(service):
    assert app_status("default") == "RUNNING"


def test_serve_never_shows_a_captioner_that_cannot_load_healthy(service):
    """Its one replica waits in its constructor, retrying (load_retry_s 1): STARTING, the deployment
    UPDATING and the vision application DEPLOYING for as long as the load fails; not replaced."""
    seen = set()
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        status, replicas = captioner_in_serve()
        seen.add(status)
        assert replicas == {"STARTING": 1}, replicas
        time.sleep(0.5)
    assert seen == {"UPDATING"}, seen
    assert app_status("vision") == "DEPLOYING" and app_status("default") == "RUNNING"
    assert len(replica_starts(service)) == 1, replica_starts(service)


def test_text_requests_unaffected(service, http):
    response = http.post(
        "/v1/chat/completions", json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "user: hi"


def test_image_request_degrades_visibly(service, weights_dir, http):
    response = http.post("/v1/chat/completions", json=image_chat("echo", data_url(png_bytes()), text="see?"))
    assert response.status_code == 200
    assert response.headers["x-vision-degraded"] == "captioner-unavailable"
    prompt = response.json()["choices"][0]["message"]["content"]
    assert prompt == f"user: see?\nImage 1: {unseen_marker('captioner_unavailable')}"
    [unseen] = response.json()["vision"]["unseen_images"]
    # No replica could be asked: the waiting one's own words (from the load board) say why.
    assert unseen["reason"] == "captioner_unavailable" and str(weights_dir) in unseen["message"], unseen


def test_streaming_image_request_degrades_too(service, http):
    body = {**image_chat("echo", data_url(png_bytes())), "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["x-vision-degraded"] == "captioner-unavailable"
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert unseen_marker("captioner_unavailable") in "".join(
        c["choices"][0]["delta"].get("content", "") for c in chunks
    )
    assert chunks[0]["vision"]["degraded"] is True


def test_health_says_why(service, weights_dir, http):
    response = http.get("/health")
    assert response.status_code == 200  # the service answers: degraded, not down
    health = response.json()
    assert health["status"] == "degraded"
    captioner = health["components"]["captioner"]
    assert not captioner["ready"] and captioner["model"] == "cap", captioner
    details = captioner["details"]
    assert details["state"] == "failed" and details["attempts"] >= 1 and details["replicas"] == {"STARTING": 1}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", details["next_retry_at"]), details
    assert str(weights_dir) in captioner["reason"] and "Traceback" not in captioner["reason"], captioner


def test_reject_policy_answers_503(service, models_file, http):
    from deployments.app import build_app

    # The one fake GPU is already packed with this module's decoder and captioner (0.5 each).
    args = {"models_file": str(models_file), "on_image_failure": "reject", "decoder_gpus": 0}
    serve.run(build_app(args), name="strict", route_prefix="/strict")
    response = http.post("/strict/v1/chat/completions", json=image_chat("echo", data_url(png_bytes())))
    assert response.status_code == 503
    assert response.headers["retry-after"].isdigit()
    error = response.json()["error"]
    assert error["code"] == "captioner_unavailable" and "unavailable" in error["message"]
    text = http.post(
        "/strict/v1/chat/completions", json={"model": "echo", "messages": [{"role": "user", "content": "x"}]}
    )
    assert text.status_code == 200


def test_recovers_without_restart(service, weights_dir, tiny_vlm_dir, http):
    for item in tiny_vlm_dir.iterdir():
        shutil.copy(item, weights_dir / item.name)

    def captioner_ready() -> bool:
        return http.get("/health").json()["components"]["captioner"]["ready"]

    assert wait_until(captioner_ready, timeout_s=120)
    assert captioner_in_serve() == ("HEALTHY", {"RUNNING": 1}) and app_status("vision") == "RUNNING"
    assert len(replica_starts(service)) == 1  # the waiting replica loaded the weights itself
    assert wait_until(
        lambda: (
            "x-vision-degraded"
            not in http.post("/v1/chat/completions", json=image_chat("echo", data_url(png_bytes()))).headers
        ),
        timeout_s=30,
    )
    response = http.post("/v1/chat/completions", json=image_chat("echo", data_url(png_bytes()), text="now?"))
    prompt = response.json()["choices"][0]["message"]["content"]
    assert prompt.startswith("user: now?\nImage 1: ") and "could not be seen" not in prompt
    assert "vision" not in response.json()
    assert http.get("/health").json()["status"] == "ok"

"""Graceful fallback: a captioner that cannot load (its weights are missing) never takes the main
application down; image requests degrade (or are rejected, by policy), /health says why, and the
service uses the captioner again, without a restart, once it can load."""

import json
import shutil

import pytest

from deployments.ingress.vision.rewrite import unseen_marker
from tests.conftest import data_url, png_bytes
from tests.serve.conftest import (
    app_status,
    deploy,
    echo_with_captioner,
    image_chat,
    replica_log_lines,
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
    deploy(models_file)
    yield
    undeploy("default", "vision", "strict")


def test_main_application_stays_running(service):
    assert app_status("default") == "RUNNING"


def test_text_requests_unaffected(service, http):
    response = http.post(
        "/v1/chat/completions", json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "user: hi"


def test_image_request_degrades_visibly(service, http):
    failed_before = replica_log_lines("VisionCaptioner", "Request failed", app="vision")
    response = http.post("/v1/chat/completions", json=image_chat("echo", data_url(png_bytes()), text="see?"))
    assert response.status_code == 200
    # The captioner was asked, and answered that it cannot caption yet: no "Request failed" and
    # traceback in its log.
    asked = replica_log_lines("VisionCaptioner", response.headers["x-request-id"], app="vision")
    assert any("CALL" in line for line in asked), asked
    assert replica_log_lines("VisionCaptioner", "Request failed", app="vision") == failed_before
    assert response.headers["x-vision-degraded"] == "captioner-unavailable"
    prompt = response.json()["choices"][0]["message"]["content"]
    assert prompt == f"user: see?\nImage 1: {unseen_marker('captioner_unavailable')}"
    assert response.json()["vision"]["unseen_images"][0]["reason"] == "captioner_unavailable"


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
    assert not captioner["ready"]
    # The loader's own words, naming the empty directory: the replica's, or Serve's while Serve replaces
    # the failing replica (tests/serve/test_captioner_health.py), after the last cause this ingress
    # heard. An ingress that never reached a running replica hears it once Serve's message carries
    # the failed start's traceback (seconds after the replacement starts).
    reason = lambda: http.get("/health").json()["components"]["captioner"]["reason"]  # noqa: E731
    assert wait_until(lambda: str(weights_dir) in reason(), timeout_s=90), reason()


def test_reject_policy_answers_503(service, models_file, http):
    from ray import serve

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

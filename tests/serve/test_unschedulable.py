"""A captioner that asks for more GPUs than the cluster has never gets a replica: its application
stays DEPLOYING, the main application is RUNNING, and image requests degrade with Serve's reason."""

import pytest

from tests.conftest import data_url, png_bytes
from tests.serve.conftest import app_status, deploy, echo_with_captioner, image_chat, undeploy, write_models


@pytest.fixture(scope="module")
def service(serve_cluster, tmp_path_factory, tiny_vlm_dir):
    directory = tmp_path_factory.mktemp("unschedulable")
    models = write_models(directory, echo_with_captioner(tiny_vlm_dir), proxy_vision={"timeout_s": 3})
    deploy(models, wait_for_captioner=False, captioner_gpus=4)  # the test cluster has one (fake) GPU
    yield
    undeploy("default", "vision")


def test_main_running_while_captioner_cannot_be_scheduled(service):
    assert app_status("default") == "RUNNING"
    assert app_status("vision") == "DEPLOYING"


def test_image_request_degrades_after_the_deadline(service, http):
    reasons = []
    for _ in range(2):  # the second one is answered from the failure memory
        response = http.post("/v1/chat/completions", json=image_chat("echo", data_url(png_bytes())))
        assert response.status_code == 200
        assert response.headers["x-vision-degraded"] == "captioner-unavailable"
        reasons.append(response.json()["vision"]["unseen_images"][0]["reason"])
    assert reasons == ["captioner_timeout", "captioner_unavailable"]


def test_health_quotes_serve(service, http):
    captioner = http.get("/health").json()["components"]["captioner"]
    assert not captioner["ready"]
    assert "'vision' is DEPLOYING" in captioner["reason"]

"""Proxy vision through the real service: the caption the captioner produces is what reaches the
decoder's prompt (the echo decoder answers with its prompt)."""

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from ray import serve

from deployments.protocol.replica import CaptionRequest
from tests.conftest import data_url, png_bytes
from tests.serve.conftest import (
    deploy,
    echo_with_captioner,
    image_chat,
    ingress_log_lines,
    kill_replicas,
    undeploy,
    wait_until,
    write_models,
)

TEMPLATE = "Describe the image. Question: {user_text}"


@pytest.fixture(scope="module")
def image_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("images")


@pytest.fixture(scope="module")
def service(serve_cluster, tmp_path_factory, tiny_vlm_dir, image_dir):
    models = write_models(
        tmp_path_factory.mktemp("proxy"),
        echo_with_captioner(tiny_vlm_dir, max_new_tokens=6, prompt_template=TEMPLATE, batch_wait_timeout_s=0.2),
        images={"file_root": str(image_dir)},
    )
    deploy(models)
    yield
    undeploy("default", "vision")


def captioner_health(http) -> dict:
    return http.get("/health").json()["components"]["captioner"]


def answer(http, url: str, text: str = "What is in this picture?") -> str:
    response = http.post("/v1/chat/completions", json=image_chat("echo", url, text=text))
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def caption_directly(image: bytes, user_text: str) -> str:
    handle = serve.get_deployment_handle("VisionCaptioner", app_name="vision")
    request = CaptionRequest(images=[image], prompts=[TEMPLATE.format(user_text=user_text)])
    return handle.caption.remote(request).result(timeout_s=60).captions[0]


def test_caption_reaches_the_decoder_prompt(service, http):
    image = png_bytes((0, 128, 255))
    response = http.post("/v1/chat/completions", json=image_chat("echo", data_url(image), text="what is it?"))
    assert response.status_code == 200
    prompt = response.json()["choices"][0]["message"]["content"]
    caption = caption_directly(image, "what is it?")
    assert caption
    assert prompt == f"user: what is it?\nImage 1: {caption}"


def test_images_in_earlier_turns_are_numbered_in_order(service, http):
    first, second = png_bytes((255, 0, 0)), png_bytes((0, 255, 0), size=(20, 60))
    body = {
        "model": "echo",
        "messages": [
            {"role": "system", "content": "You see images as text."},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(first)}}]},
            {"role": "assistant", "content": "Nice."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "and now?"},
                    {"type": "image_url", "image_url": {"url": data_url(second)}},
                ],
            },
        ],
    }
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    prompt = response.json()["choices"][0]["message"]["content"]
    expected = (
        "system: You see images as text.\n"
        f"user: Image 1: {caption_directly(first, '')}\n"
        "assistant: Nice.\n"
        f"user: and now?\nImage 2: {caption_directly(second, 'and now?')}"
    )
    assert prompt == expected


def test_streamed_prompt_matches(service, http):
    image = png_bytes((9, 9, 9))
    body = {**image_chat("echo", data_url(image), text="hm"), "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: {")]
    import json

    text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content", "") for line in lines[:-1])
    assert text == f"user: hm\nImage 1: {caption_directly(image, 'hm')}"


def test_repeated_image_never_reaches_the_captioner_again(service, http, image_dir):
    """Once as a data URL, then as a file:// URL: one caption, then cache hits; no new batch."""
    image = png_bytes((200, 100, 50), size=(40, 40))
    (image_dir / "same.png").write_bytes(image)
    before = captioner_health(http)
    first = answer(http, data_url(image))
    after_first = captioner_health(http)
    second = answer(http, f"file://{image_dir / 'same.png'}")
    third = answer(http, data_url(image))
    after = captioner_health(http)
    assert first == second == third
    assert after_first["cache"]["misses"] == before["cache"]["misses"] + 1
    assert after["cache"]["misses"] == after_first["cache"]["misses"]
    assert after["cache"]["hits"] == after_first["cache"]["hits"] + 2
    assert after["details"]["last_batch_sizes"] == after_first["details"]["last_batch_sizes"]


def test_concurrent_images_are_batched_and_each_gets_its_own_caption(service, http):
    images = [png_bytes((30 * i, 255 - 30 * i, 7), size=(24 + i, 24)) for i in range(8)]
    with ThreadPoolExecutor(len(images)) as pool:
        prompts = list(pool.map(lambda im: answer(http, data_url(im), text="which?"), images))
    assert prompts == [f"user: which?\nImage 1: {caption_directly(im, 'which?')}" for im in images]
    assert len(set(prompts)) > 1
    assert max(captioner_health(http)["details"]["last_batch_sizes"]) > 1


def test_captioner_killed_under_traffic(service, http):
    """Text requests never notice; image requests in flight are answered (captioned or degraded,
    never an error); the degradation is logged with the request's id; captions come back without
    any restart of ours."""
    images = [data_url(png_bytes((i, 7, 7))) for i in range(12)]

    def text(i: int) -> int:
        body = {"model": "echo", "messages": [{"role": "user", "content": f"text {i}"}]}
        return http.post("/v1/chat/completions", json=body).status_code

    def image(i: int):
        return http.post("/v1/chat/completions", json=image_chat("echo", images[i], text=f"image {i}"))

    with ThreadPoolExecutor(8) as pool:
        texts = [pool.submit(text, i) for i in range(12)]
        shots = [pool.submit(image, i) for i in range(12)]
        time.sleep(0.3)
        kill_replicas("VisionCaptioner")
        assert [t.result(timeout=120) for t in texts] == [200] * 12
        answers = [s.result(timeout=120) for s in shots]
    assert [a.status_code for a in answers] == [200] * 12, [a.text for a in answers if a.status_code != 200]
    fresh = data_url(png_bytes((200, 100, 50)))
    assert wait_until(
        lambda: "x-vision-degraded" not in http.post("/v1/chat/completions", json=image_chat("echo", fresh)).headers,
        timeout_s=120,
    )
    degraded = [a for a in answers if "x-vision-degraded" in a.headers]
    if degraded:
        rid = degraded[0].headers["x-request-id"]
        assert wait_until(lambda: any(rid in line for line in ingress_log_lines("answering without")), timeout_s=10)


def test_captioner_death_degrades_new_image_requests_without_waiting_for_the_restart(service, http):
    """With no caption in flight when the captioner dies, the next image request cannot learn of the
    death from a failed call: it waits in Serve's queue for a replacement. The client watches Serve's
    view of the captioner and degrades the request once Serve reports it unhealthy."""
    fresh = data_url(png_bytes((1, 2, 3)))
    assert wait_until(lambda: captioner_health(http)["ready"], timeout_s=120)
    kill_replicas("VisionCaptioner")
    response = http.post("/v1/chat/completions", json=image_chat("echo", fresh, text="after the kill"))
    assert response.status_code == 200, response.text
    assert response.headers.get("x-vision-degraded") == "captioner-unavailable"
    rid = response.headers["x-request-id"]
    assert wait_until(lambda: any(rid in line for line in ingress_log_lines("Serve reports VisionCaptioner")))
    assert wait_until(
        lambda: "x-vision-degraded" not in http.post("/v1/chat/completions", json=image_chat("echo", fresh)).headers,
        timeout_s=120,
    )

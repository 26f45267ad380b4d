"""Proxy vision through the real service: the caption the captioner produces is what reaches the
decoder's prompt (the echo decoder answers with its prompt)."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from ray import serve

from deployments.protocol import CaptionRequest
from tests.conftest import data_url, png_bytes
from tests.serve.conftest import deploy, echo_with_captioner, image_chat, undeploy, write_models

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
    return handle.caption.remote(request).result(timeout_s=60)[0]


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


def test_captioner_replica_killed_then_back(service, http):
    """A dead captioner replica never fails a request; Serve restarts it and captions return."""
    import ray

    from tests.serve.conftest import wait_until

    replicas = [a for a in ray.util.list_named_actors(all_namespaces=True) if "VisionCaptioner" in a["name"]]
    assert replicas
    for actor in replicas:
        ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
    image = data_url(png_bytes((1, 2, 3)))
    for _ in range(3):  # degraded or already recovered, but always answered
        assert http.post("/v1/chat/completions", json=image_chat("echo", image)).status_code == 200
    assert wait_until(
        lambda: "x-vision-degraded" not in http.post("/v1/chat/completions", json=image_chat("echo", image)).headers,
        timeout_s=120,
    )

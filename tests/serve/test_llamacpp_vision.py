"""GGUF vision on llama.cpp behind real Ray Serve, driven by the official openai client: the tiny GGUF
VLM (the offline SmolLM2 GGUF with a random LLaVA-style projector, `scripts/bench/tiny_models.py`)
as a native primary (`engine: auto` on CPU) and, for a second primary that is text only, as its
captioner in proxy mode (`engine: auto`, `captioner_gpus: 0`). One deployment serves the module."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from scripts.bench.tiny_models import SMOLLM2_FILE, TINY_MMPROJ_FILE, tiny_mmproj_image_tokens
from tests.conftest import data_url, png_bytes
from tests.serve.conftest import BASE_URL, deploy, undeploy, write_models

VLM, ECHO = "gguf-vlm", "echo"
CONTEXT = 160
LIMIT = 2
PER_IMAGE = tiny_mmproj_image_tokens()
QUESTION = "What is in this picture?"


@pytest.fixture(scope="module")
def client(serve_cluster, tmp_path_factory, tiny_gguf_vlm_dir):
    files = {"local_path": str(tiny_gguf_vlm_dir), "weight_file": SMOLLM2_FILE, "mmproj_file": TINY_MMPROJ_FILE}
    models = write_models(
        tmp_path_factory.mktemp("llamacpp-vision"),
        [
            {
                "name": VLM,
                **files,
                "params": {"max_tokens": 12, "max_num_seqs": 4, "max_model_len": CONTEXT, "temperature": 0},
                "capabilities": {"vision_mode": "native", "max_images_per_request": LIMIT},
            },
            {
                "name": ECHO,
                "engine": "fake",
                "params": {"max_tokens": 4096},
                "capabilities": {"vision_mode": "proxy", "captioner": "gguf-captioner"},
            },
            {
                "name": "gguf-captioner",
                **files,
                "params": {"max_model_len": 128},
                "captioning": {"max_batch_size": 2, "max_new_tokens": 8, "batch_wait_timeout_s": 0.2},
            },
        ],
        primaries=[VLM, ECHO],
    )
    deploy(models, decoder_gpus=0, captioner_gpus=0)  # on CPU: engine auto is llama.cpp for both
    yield openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key="unused", max_retries=0, timeout=120)
    undeploy("default", "vision")


def chat(*images: bytes, text: str = QUESTION) -> list[dict]:
    parts = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": data_url(image)}} for image in images]
    return [{"role": "user", "content": parts}]


def ask(client: openai.OpenAI, *images: bytes, **extra) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(model=VLM, messages=chat(*images), **extra)


def components(model: str = VLM) -> dict:
    return httpx.get(f"{BASE_URL}/health", timeout=30).json()["models"][model]["components"]


def test_an_image_is_answered_and_usage_counts_its_tokens(client):
    details = components()["decoder"]["details"]
    assert (details["engine"], details["image_tokens"]) == ("llama.cpp", {"per_image": PER_IMAGE})
    text_only = client.chat.completions.create(model=VLM, messages=[{"role": "user", "content": QUESTION}])
    image = png_bytes((10, 200, 30))
    whole = ask(client, image)
    assert whole.choices[0].message.content and whole.choices[0].finish_reason == "length"
    assert whole.usage.prompt_tokens == text_only.usage.prompt_tokens + PER_IMAGE
    chunks = list(ask(client, image, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_concurrent_image_requests_share_the_replica_and_answer_from_their_own_image(client):
    """Four image requests at once in the one replica's slots: each has its first token before any
    has finished (one after another, the last would start when the others are done), and each
    answers as it does alone."""
    images = [png_bytes((255, 0, 0)), png_bytes((0, 0, 255)), png_bytes((0, 255, 0), size=(20, 40)), png_bytes()]
    alone = [ask(client, image, max_tokens=24).choices[0].message.content for image in images]
    assert len(set(alone)) > 1  # the answers depend on the image

    def one(image: bytes) -> tuple[str, float, float]:
        first, text = None, ""
        for chunk in ask(client, image, max_tokens=24, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.monotonic()
                text += chunk.choices[0].delta.content
        return text, first or float("inf"), time.monotonic()

    with ThreadPoolExecutor(len(images)) as pool:
        together = list(pool.map(one, images))
    assert [text for text, _, _ in together] == alone
    assert max(r[1] for r in together) < min(r[2] for r in together)


def test_more_images_than_the_model_allows_is_a_400_that_states_the_limit(client):
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, *[png_bytes((i, i, i)) for i in range(LIMIT + 1)])
    assert f"the limit is {LIMIT}" in caught.value.message and caught.value.body["param"] == "messages"


def test_a_prompt_over_the_context_is_a_400_that_counts_its_image_tokens(client):
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, png_bytes((1, 2, 3)), png_bytes((3, 2, 1)), max_tokens=CONTEXT - 40)
    message = caught.value.message
    assert caught.value.code == "context_length_exceeded"
    assert f"context is {CONTEXT} tokens" in message and f"({2 * PER_IMAGE} of them image tokens)" in message
    assert f"{CONTEXT - 40} completion tokens" in message


def test_the_captioner_on_llama_cpp_describes_images_for_a_text_primary(client):
    """Proxy mode: the echo decoder answers with its prompt, where each image is a caption line."""
    reply = client.chat.completions.create(model=ECHO, messages=chat(png_bytes((200, 0, 0)), png_bytes((0, 0, 200))))
    answer = reply.choices[0].message.content
    captions = [line.split(": ", 1)[1] for line in answer.splitlines() if line.startswith("Image ")]
    assert answer.startswith(f"user: {QUESTION}\nImage 1: ") and len(captions) == 2 and all(captions), answer
    captioner = components(ECHO)["captioner"]
    assert captioner["ready"] and captioner["details"]["engine"] == "llama.cpp"
    assert max(captioner["details"]["last_batch_sizes"]) == 2  # both images in one batch, in its two slots

"""Native vision through the real service, with the official openai client: a tiny LLaVA (built
locally, loaded by the same code as real VLMs) is the primary and receives the images itself.

The primary is `ProbedNativeEngine` (tests/support/native_probe.py): the real native engine
that also reports a hash of the pixel values its vision tower received, and whose processor refuses
one colour. One deployment serves the whole module."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from PIL import Image
from transformers import AutoProcessor

from deployments.engines.transformers.chat_template import resolve_tool_rendering
from deployments.engines.transformers.native_prompt import NativePromptBuilder
from deployments.engines.transformers.processor_cache import ProcessorCache
from deployments.ingress.vision.native import native_messages
from deployments.protocol.openai.chat import ChatCompletionRequest
from deployments.protocol.replica import ImageBytes
from tests.conftest import data_url, png_bytes
from tests.serve.conftest import BASE_URL, deploy, undeploy, write_models
from tests.support.native_probe import REFUSED_COLOUR, pixel_sha256

MODEL = "tiny-vlm"
CONTEXT = 96
LIMIT = 2


@pytest.fixture(scope="module")
def service(serve_cluster, tmp_path_factory, tiny_vlm_dir):
    models = write_models(
        tmp_path_factory.mktemp("native"),
        [
            {
                "name": MODEL,
                "local_path": str(tiny_vlm_dir),
                "engine": "tests.support.native_probe:ProbedNativeEngine",
                "params": {
                    "max_tokens": 6,
                    "max_num_seqs": 4,
                    "temperature": 0,
                    "max_model_len": CONTEXT,
                    "batch_wait_ms": 300,  # so that requests sent together share a batch
                },
                "capabilities": {"vision_mode": "native", "max_images_per_request": LIMIT},
            }
        ],
    )
    deploy(models, decoder_cpu_replicas=1)  # one replica: /health shows the one that served
    yield
    undeploy("default", "vision")


@pytest.fixture
def client() -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key="unused", max_retries=0, timeout=120)


def chat(*images: bytes, text: str = "What is in this picture?") -> list[dict]:
    parts = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": data_url(image)}} for image in images]
    return [{"role": "user", "content": parts}]


def ask(client: openai.OpenAI, *images: bytes, **extra) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(model=MODEL, messages=chat(*images), **extra)


def decoder_details(http) -> dict:
    return http.get("/health").json()["components"]["decoder"]["details"]


def test_native_answer_whole_and_streamed_with_image_tokens_in_usage(service, client, tiny_vlm_dir):
    image = png_bytes((10, 200, 30))
    whole = ask(client, image)
    assert whole.choices[0].finish_reason in ("stop", "length") and whole.choices[0].message.content
    processor = AutoProcessor.from_pretrained(tiny_vlm_dir)
    tools = resolve_tool_rendering(processor, "auto", MODEL)  # as the engine resolves it
    builder = NativePromptBuilder(processor, None, ProcessorCache(0), tools)
    body = ChatCompletionRequest.model_validate({"model": MODEL, "messages": chat(image)})
    expected = builder.chat(native_messages(body.messages), [ImageBytes(data=image, sha256="unused: no cache")])
    assert expected.image_tokens == 16
    assert whole.usage is not None and whole.usage.prompt_tokens == len(expected.ids)
    stream = ask(client, image, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # pieces, not one block
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == len(expected.ids)


def test_the_pixels_the_model_received_came_from_the_image_sent(service, client, http, tiny_vlm_dir):
    image = png_bytes((123, 45, 67), size=(50, 20))
    ask(client, image)
    processor = AutoProcessor.from_pretrained(tiny_vlm_dir)
    with Image.open(io.BytesIO(image)) as img:
        pixels = processor.image_processor(images=[img.convert("RGB")], return_tensors="pt")["pixel_values"][0]
    assert decoder_details(http)["pixel_hashes"][-1] == pixel_sha256(pixels)


def test_concurrent_requests_are_batched_and_answer_from_their_own_image(service, client, http):
    images = [png_bytes((255, 0, 0)), png_bytes((0, 0, 255)), png_bytes((0, 255, 0), size=(20, 40))]
    alone = [ask(client, image).choices[0].message.content for image in images]
    assert len(set(alone)) > 1  # the answers depend on the image
    with ThreadPoolExecutor(len(images)) as pool:
        together = list(pool.map(lambda image: ask(client, image).choices[0].message.content, images))
    assert together == alone
    assert max(decoder_details(http)["last_batch_sizes"]) >= 3  # all three in one batch


def test_more_images_than_the_model_allows_is_a_400_that_states_the_limit(service, client):
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, *[png_bytes((i, i, i)) for i in range(LIMIT + 1)])
    assert f"the limit is {LIMIT}" in caught.value.message
    assert caught.value.body["param"] == "messages"


def test_context_overflow_with_image_tokens_is_a_400_with_the_numbers(service, client):
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, png_bytes((1, 2, 3)), png_bytes((3, 2, 1)), max_tokens=CONTEXT - 40)
    assert caught.value.code == "context_length_exceeded"
    message = caught.value.message
    assert f"context is {CONTEXT} tokens" in message and "(32 of them image tokens)" in message
    assert f"{CONTEXT - 40} completion tokens" in message


def test_a_repeated_image_is_a_processor_cache_hit(service, client, http):
    image = png_bytes((77, 88, 99))
    before = decoder_details(http)["processor_cache"]
    first = ask(client, image).choices[0].message.content
    middle = decoder_details(http)["processor_cache"]
    second = ask(client, image).choices[0].message.content
    after = decoder_details(http)["processor_cache"]
    assert first == second
    assert middle["misses"] == before["misses"] + 1 and after["misses"] == middle["misses"]
    assert after["hits"] == middle["hits"] + 1


def test_an_image_the_processor_refuses_fails_alone(service, client):
    def refused():
        with pytest.raises(openai.BadRequestError) as caught:
            ask(client, png_bytes(REFUSED_COLOUR))
        return caught.value

    with ThreadPoolExecutor(2) as pool:
        error = pool.submit(refused)
        fine = pool.submit(ask, client, png_bytes((5, 6, 7)))
        assert error.result().code == "invalid_image" and "could not process" in error.result().message
        assert fine.result().choices[0].message.content


def test_health_shows_the_memory_profile(service, http):
    profile = decoder_details(http)["memory_profile"]
    assert profile["peak_mb"] > 0 and profile["seqs"] == 4 and profile["measured"] == "process_peak_rss"
    assert profile["image_tokens_per_image"] == 16 and profile["images_per_seq"] == LIMIT

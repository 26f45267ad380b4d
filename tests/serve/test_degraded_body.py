"""What clients keep of a degraded answer, with a captioner that cannot load (its weights are
missing), read by the official openai client and by LangChain's ChatOpenAI as their users would:
the `vision` field (openai), `system_fingerprint` (both; the field LangChain keeps), and the
configured notice before the text (every client)."""

from collections.abc import Iterator

import pytest
from langchain_core.messages import AIMessageChunk, HumanMessage
from langchain_openai import ChatOpenAI
from openai import OpenAI

from deployments.protocol.openai.common import DEGRADED_FINGERPRINT
from tests.conftest import data_url, png_bytes
from tests.serve.conftest import BASE_URL, deploy, echo_with_captioner, undeploy, write_models
from tests.support import pdfs

NOTICE = "[Image not seen.] "
PARTS = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": data_url(png_bytes())}}]


@pytest.fixture(scope="module")
def service(serve_cluster, tmp_path_factory) -> Iterator[None]:
    empty = tmp_path_factory.mktemp("no-weights")
    models = write_models(
        tmp_path_factory.mktemp("degraded-body"),
        echo_with_captioner(empty),
        load_retry_s=60,
        proxy_vision={"timeout_s": 20, "retry_after_s": 0.5, "degraded_notice": NOTICE},
    )
    deploy(models)
    yield
    undeploy("default", "vision")


@pytest.fixture
def openai_client() -> OpenAI:
    return OpenAI(base_url=f"{BASE_URL}/v1", api_key="none", max_retries=0, timeout=120)


def langchain(**options) -> ChatOpenAI:
    return ChatOpenAI(model="echo", base_url=f"{BASE_URL}/v1", api_key="none", max_retries=0, timeout=120, **options)


def assert_unseen(vision: dict) -> None:
    assert vision["degraded"] is True
    [image] = vision["unseen_images"]
    assert (image["index"], image["reason"]) == (0, "captioner_unavailable")
    assert "unavailable" in image["message"]


def test_openai_client_keeps_the_vision_field_only_when_an_image_was_not_seen(service, openai_client):
    completion = openai_client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": PARTS}], temperature=0
    )
    assert completion.model_extra is not None
    assert_unseen(completion.model_extra["vision"])
    assert completion.system_fingerprint == DEGRADED_FINGERPRINT
    content = completion.choices[0].message.content
    assert content is not None and content.startswith(NOTICE)
    assert "could not be seen" in content  # the echo decoder answers with its prompt: the marker reached it
    text = openai_client.chat.completions.create(model="echo", messages=[{"role": "user", "content": "hi"}])
    assert "vision" not in (text.model_extra or {}) and text.system_fingerprint is None  # nothing unseen
    assert text.choices[0].message.content == "user: hi"


def test_openai_client_streamed_keeps_it_on_the_first_chunk(service, openai_client):
    stream = openai_client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": PARTS}], temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].model_extra is not None
    assert_unseen(chunks[0].model_extra["vision"])
    assert not any("vision" in (chunk.model_extra or {}) for chunk in chunks[1:])
    assert {chunk.system_fingerprint for chunk in chunks} == {DEGRADED_FINGERPRINT}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith(NOTICE)


def test_langchain_invoke_says_the_image_was_not_seen(service):
    message = langchain().invoke([HumanMessage(content=PARTS)])
    assert message.response_metadata["system_fingerprint"] == DEGRADED_FINGERPRINT
    assert isinstance(message.content, str) and message.content.startswith(NOTICE)
    with_headers = langchain(include_response_headers=True).invoke([HumanMessage(content=PARTS)])
    assert with_headers.response_metadata["headers"]["x-vision-degraded"] == "captioner-unavailable"


def test_langchain_stream_says_the_image_was_not_seen(service):
    chunks = list(langchain().stream([HumanMessage(content=PARTS)]))
    message = chunks[0]
    for chunk in chunks[1:]:
        message += chunk
    assert isinstance(message, AIMessageChunk)
    assert message.response_metadata["system_fingerprint"] == DEGRADED_FINGERPRINT
    assert isinstance(message.content, str) and message.content.startswith(NOTICE)


def test_a_pages_image_not_captioned_is_named_by_document_and_page(service, openai_client):
    pdf = pdfs.pdf_with_image_page([pdfs.page_text(1, 3)], [])
    part = {"type": "file", "file": {"file_data": data_url(pdf, "application/pdf"), "filename": "scan.pdf"}}
    completion = openai_client.chat.completions.create(model="echo", messages=[{"role": "user", "content": [part]}])
    assert completion.model_extra is not None
    vision = completion.model_extra["vision"]
    assert vision["unseen_images"] == []
    assert vision["unseen_pages"] == [
        {"document": 0, "filename": "scan.pdf", "page": 2, "reason": "captioner_unavailable"}
    ]
    content = completion.choices[0].message.content or ""
    assert "Marker001" in content  # the text page is read all the same
    assert (
        "[document scan.pdf, page 2 of 2]\nImage 1: [This page has no text layer, and it could not be seen" in content
    )

"""Documents through real Ray Serve (issue 57), with PDFs made at test time: the echo decoder answers
with its prompt, so the tests read what the model got. Each wire shape sent by its official client
(chat's `file` part and Responses' `input_file` by openai, Messages' `document` blocks by anthropic,
also inside a `tool_result`); the pages' text in order, a page without text captioned by the tiny
local captioner; a /v1/files upload named by `file_id`; token counts (usage, /tokenize, count_tokens)
that include the documents; an encrypted, a malformed and an over-the-cap PDF refused with a 400 in
each API's shape. One deployment (the echo decoder and the tiny captioner) for the module."""

from __future__ import annotations

import base64
import re

import anthropic
import httpx
import openai
import pytest

from tests.serve.conftest import BASE_URL, deploy, echo_with_captioner, undeploy, write_models
from tests.support import pdfs

MAX_PAGES = 250


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def pdf_url(data: bytes) -> str:
    return f"data:application/pdf;base64,{b64(data)}"


def markers(text: str) -> list[str]:
    return re.findall(r"Marker\d{3}", text)


@pytest.fixture(scope="module")
def service(serve_cluster, tmp_path_factory, tiny_vlm_dir):
    folder = tmp_path_factory.mktemp("documents")
    models = write_models(
        folder,
        echo_with_captioner(tiny_vlm_dir, max_new_tokens=6),
        documents={"max_pages_per_request": MAX_PAGES},
        server={"state": {"storage_root": str(folder / "storage")}},
    )
    deploy(models)
    yield
    undeploy("default", "vision")


@pytest.fixture
def oai() -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{BASE_URL}/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture
def claude() -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=BASE_URL, api_key="none", max_retries=0, timeout=120)


def test_chat_file_part_text_in_order_and_the_image_only_page_captioned(service, oai):
    pdf = pdfs.pdf_with_image_page([pdfs.page_text(1, 5)], [pdfs.page_text(3, 5)])
    file_part = {"type": "file", "file": {"file_data": pdf_url(pdf), "filename": "report.pdf"}}
    completion = oai.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": [{"type": "text", "text": "Summarise."}, file_part]}]
    )
    prompt = completion.choices[0].message.content or ""
    assert markers(prompt) == ["Marker001", "Marker003"]
    captioned = re.search(
        r"\[document report\.pdf, page 2 of 3\]\nImage 1: (.+)\n\[document report\.pdf, page 3", prompt
    )
    assert captioned and captioned.group(1).strip()  # the tiny captioner's words, not an unseen mark
    assert "could not be seen" not in prompt
    assert (completion.model_extra or {}).get("vision") is None

    plain = oai.chat.completions.create(model="echo", messages=[{"role": "user", "content": "Summarise."}])
    assert completion.usage and plain.usage
    assert completion.usage.prompt_tokens > plain.usage.prompt_tokens + 12  # the pages' words are counted


def test_responses_input_file_of_200_pages_arrives_whole_and_in_order(service, oai):
    pdf = pdfs.numbered_pdf(200, words=4)
    response = oai.responses.create(
        model="echo",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Read it."},
                    {"type": "input_file", "filename": "long.pdf", "file_data": pdf_url(pdf)},
                ],
            }
        ],
        max_output_tokens=4000,
    )
    assert markers(response.output_text) == [f"Marker{n:03d}" for n in range(1, 201)]
    assert "[document long.pdf, page 200 of 200]" in response.output_text


def test_a_files_upload_named_by_file_id(service, oai):
    uploaded = oai.files.create(file=("notes.pdf", pdfs.numbered_pdf(2, words=3)), purpose="user_data")
    completion = oai.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": [{"type": "file", "file": {"file_id": uploaded.id}}]}]
    )
    prompt = completion.choices[0].message.content or ""
    assert "[document notes.pdf, page 1 of 2]" in prompt and markers(prompt) == ["Marker001", "Marker002"]
    counted = httpx.post(
        f"{BASE_URL}/tokenize",
        json={
            "model": "echo",
            "messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": uploaded.id}}]}],
        },
        timeout=60,
    )
    assert completion.usage and counted.json()["count"] == completion.usage.prompt_tokens  # the pages counted alike
    with pytest.raises(openai.NotFoundError):
        oai.chat.completions.create(
            model="echo", messages=[{"role": "user", "content": [{"type": "file", "file": {"file_id": "file-nope"}}]}]
        )


def test_messages_document_blocks_and_a_tool_results_document_and_count_tokens(service, claude):
    pdf = pdfs.numbered_pdf(2, words=3)
    document = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": b64(pdf)}}
    note = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "Meeting at noon."}}
    messages = [
        {"role": "user", "content": "Open the report."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{**document, "title": "report.pdf"}]},
                {**note, "title": "note.txt"},
                {"type": "text", "text": "What do they say?"},
            ],
        },
    ]
    answer = claude.messages.create(model="echo", max_tokens=2000, messages=messages)  # type: ignore[arg-type]
    text = "".join(block.text for block in answer.content if block.type == "text")
    assert markers(text) == ["Marker001", "Marker002"]
    assert text.index("[document report.pdf, page 1 of 2]") < text.index("[document note.txt]\nMeeting at noon.")
    counted = claude.messages.count_tokens(model="echo", messages=messages)  # type: ignore[arg-type]
    without = claude.messages.count_tokens(model="echo", messages=[{"role": "user", "content": "What do they say?"}])
    assert counted.input_tokens > without.input_tokens + 10


def test_bad_documents_are_a_400_naming_them_in_each_apis_shape(service, oai, claude):
    secret = {"type": "file", "file": {"file_data": pdf_url(pdfs.encrypted_pdf()), "filename": "secret.pdf"}}
    with pytest.raises(openai.BadRequestError) as chat:
        oai.chat.completions.create(model="echo", messages=[{"role": "user", "content": [secret]}])
    assert chat.value.code == "invalid_document"
    assert "Document 'secret.pdf' is encrypted" in chat.value.message

    broken = {"type": "input_file", "filename": "broken.pdf", "file_data": pdf_url(pdfs.malformed_pdf())}
    with pytest.raises(openai.BadRequestError) as responses:
        oai.responses.create(model="echo", input=[{"role": "user", "content": [broken]}])
    assert responses.value.code == "invalid_document"
    assert "Document 'broken.pdf' is not a readable PDF" in responses.value.message

    huge = pdfs.numbered_pdf(MAX_PAGES + 1, words=1)
    document = {
        "type": "document",
        "title": "huge.pdf",
        "source": {"type": "base64", "media_type": "application/pdf", "data": b64(huge)},
    }
    with pytest.raises(anthropic.BadRequestError) as messages:
        claude.messages.create(model="echo", max_tokens=16, messages=[{"role": "user", "content": [document]}])  # type: ignore[list-item]
    error = messages.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"Document 'huge.pdf' has {MAX_PAGES + 1} pages; a request may carry at most")

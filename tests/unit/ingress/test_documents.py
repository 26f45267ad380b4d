"""The document stage without Ray: PDFs made at test time read by the real worker processes (text in
page order, a page without text rendered, hostile files a 400 naming the document and the worker
replaced), the prompt's marks, truncation by whole pages, page images within the image limits and
through the captioner (or named as unseen), `file_id` for the caller only, `file_url` behind the
SSRF guard, and the cache."""

from __future__ import annotations

import base64
import io
import os
from typing import Any

import pytest
from PIL import Image
from pydantic import TypeAdapter

from deployments.config import DocumentInputConfig, ImageInputConfig
from deployments.errors import InvalidDocumentError, ObjectNotFoundError
from deployments.ingress.documents.reader import read_text
from deployments.ingress.documents.stage import DocumentStage
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.chat import ChatMessage
from deployments.state.owners import Caller
from tests.support import pdfs
from tests.unit.ingress.fakes import FakeCaptioner, FakeDecoder, answer_core

MESSAGES = TypeAdapter(list[ChatMessage])
ANYONE = Caller()


def file_part(data: bytes, name: str | None = "a.pdf", mime: str = "application/pdf") -> dict[str, Any]:
    source: dict[str, Any] = {"file_data": f"data:{mime};base64,{base64.b64encode(data).decode()}"}
    if name:
        source["filename"] = name
    return {"type": "file", "file": source}


def user(*parts: dict[str, Any]) -> list[ChatMessage]:
    return MESSAGES.validate_python([{"role": "user", "content": [{"type": "text", "text": "Read:"}, *parts]}])


def texts(messages: list[ChatMessage]) -> list[str]:
    """The text parts of the first message, each line's wrapping (the PDF's) undone."""
    content = messages[0].content
    return [_unwrapped(part.text) for part in content if part.type == "text"]  # type: ignore[union-attr]


def parts(text: str, size: int) -> list[str | None]:
    """A text document's parts (its pages) as the stage reads them, in parts of `size` characters."""
    config = DocumentInputConfig(text_part_chars=size)
    return [page.text for page in read_text(text.encode(), "t.txt", config, param="p").pages]


def _unwrapped(text: str) -> str:
    head, _, body = text.partition("]\n")
    return f"{head}]\n{' '.join(body.split())}" if body else text


@pytest.fixture
async def stage():
    documents = DocumentStage(DocumentInputConfig(parse_memory_mb=256), ImageInputConfig())
    yield documents
    await documents.workers.close()


async def test_a_pdfs_pages_come_in_order_each_marked(stage):
    expanded = await stage.expand(user(file_part(pdfs.numbered_pdf(3))), ANYONE, None)
    assert texts(expanded.messages) == [
        "Read:",
        *(f"[document a.pdf, page {n} of 3]\n{pdfs.page_text(n)}" for n in (1, 2, 3)),
    ]
    assert expanded.unseen == []


async def test_a_text_document_is_read_as_text_and_long_ones_in_parts_at_line_ends(stage):
    csv = "name,age\nada,36\n"
    expanded = await stage.expand(user(file_part(csv.encode(), "people.csv", "text/csv")), ANYONE, None)
    assert expanded.messages[0].content[1].text == f"[document people.csv]\n{csv.strip()}"  # type: ignore[union-attr]
    assert parts("aaaa\nbbbb\ncccc\n", 10) == ["aaaa\nbbbb", "cccc"]
    assert parts("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]


async def test_a_document_without_a_name_is_named_by_its_place(stage):
    expanded = await stage.expand(user(file_part(b"hello", None, "text/plain")), ANYONE, None)
    assert texts(expanded.messages)[1] == "[document document 1]\nhello"


async def test_truncation_drops_whole_pages_from_the_end_and_names_them():
    page = len(pdfs.page_text(1))
    documents = DocumentStage(DocumentInputConfig(max_chars_per_request=2 * page + 10), ImageInputConfig())
    try:
        expanded = await documents.expand(user(file_part(pdfs.numbered_pdf(5))), ANYONE, None)
    finally:
        await documents.workers.close()
    shown = texts(expanded.messages)
    assert shown[1].endswith(pdfs.page_text(1)) and shown[2].endswith(pdfs.page_text(2))
    assert not any("Marker003" in text for text in shown)  # never half a page
    assert shown[3].startswith("[document a.pdf: pages 3-5 of 5 were left out")
    assert [(p.page, p.reason) for p in expanded.unseen] == [(3, "truncated"), (4, "truncated"), (5, "truncated")]


async def test_a_page_without_text_is_an_image_within_the_limits_or_named_unseen(stage):
    pdf = pdfs.pdf_with_image_page([pdfs.page_text(1)], [pdfs.page_text(3)])
    seen = await stage.expand(user(file_part(pdf)), ANYONE, ImageInputConfig())
    parts = seen.messages[0].content
    kinds = [part.type for part in parts]  # type: ignore[union-attr]
    assert kinds == ["text", "text", "text", "image_url", "text"]
    assert parts[2].text == "[document a.pdf, page 2 of 3]"  # type: ignore[union-attr]
    png = parts[3].data  # type: ignore[union-attr]  # the page as bytes: no data URL on the way
    assert Image.open(io.BytesIO(png)).size[1] == 1024  # a portrait page, rendered to render_max_side
    assert [page.page for page in seen.page_images.values()] == [2]

    blind = await stage.expand(user(file_part(pdf)), ANYONE, None)
    assert "could not be seen (this model takes no images)" in texts(blind.messages)[3]
    assert [(p.page, p.reason) for p in blind.unseen] == [(2, "vision_disabled")]

    full = await stage.expand(user(file_part(pdf)), ANYONE, ImageInputConfig(max_images_per_request=0))
    assert [(p.page, p.reason) for p in full.unseen] == [(2, "over_image_limit")]
    assert stage.cache.stats.misses == 1 and stage.cache.stats.hits == 2  # read once


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (pdfs.encrypted_pdf, "is encrypted (password protected)"),
        (pdfs.malformed_pdf, "is not a readable PDF"),
        (lambda: pdfs.bomb_pdf(512), "needs more than 256 MB to read (documents.parse_memory_mb)"),
    ],
    ids=["encrypted", "malformed", "decompression-bomb"],
)
async def test_a_bad_pdf_is_a_400_naming_it_and_the_next_one_is_read(stage, make, words):
    with pytest.raises(InvalidDocumentError) as refused:
        await stage.expand(user(file_part(make(), "bad.pdf")), ANYONE, None)
    assert refused.value.status == 400
    assert refused.value.message.startswith("Document 'bad.pdf' ") and words in refused.value.message
    assert refused.value.param == "messages[0].content[1].file"
    expanded = await stage.expand(user(file_part(pdfs.numbered_pdf(1))), ANYONE, None)
    assert "Marker001" in texts(expanded.messages)[1]


@pytest.mark.parametrize("make", [pdfs.deep_pdf, pdfs.cyclic_pdf], ids=["deep-nesting", "cycles"])
async def test_a_pathological_pdf_is_read_or_refused_never_a_crash(stage, make):
    try:
        await stage.expand(user(file_part(make(), "odd.pdf")), ANYONE, None)
    except InvalidDocumentError as exc:
        assert "Document 'odd.pdf'" in exc.message


async def test_a_pdf_that_takes_too_long_is_killed_and_refused():
    documents = DocumentStage(DocumentInputConfig(parse_timeout_s=0.001), ImageInputConfig())
    try:
        with pytest.raises(InvalidDocumentError, match=r"could not be read within 0.001 s"):
            await documents.expand(user(file_part(pdfs.numbered_pdf(50))), ANYONE, None)
    finally:
        await documents.workers.close()


async def test_the_caps_refuse_with_a_400_naming_the_document():
    small = DocumentStage(DocumentInputConfig(max_document_bytes=1000), ImageInputConfig())
    with pytest.raises(InvalidDocumentError, match=r"Document 'big.txt' is 1001 bytes; the limit is 1000"):
        await small.expand(user(file_part(b"x" * 1001, "big.txt", "text/plain")), ANYONE, None)
    config = DocumentInputConfig(max_pages_per_request=3, max_documents_per_request=2)
    documents = DocumentStage(config, ImageInputConfig())
    try:
        with pytest.raises(InvalidDocumentError, match=r"Document 'a.pdf' has 4 pages; a request may carry at most 3"):
            await documents.expand(user(file_part(pdfs.numbered_pdf(4, words=2))), ANYONE, None)
        two = file_part(pdfs.numbered_pdf(2, words=2))
        with pytest.raises(InvalidDocumentError, match=r"have 4 pages \('a.pdf': 2, 'a.pdf': 2\); the limit is 3"):
            await documents.expand(user(two, two), ANYONE, None)
        with pytest.raises(InvalidDocumentError, match="The request has 3 documents; the limit is 2"):
            await documents.expand(user(two, two, two), ANYONE, None)
        with pytest.raises(InvalidDocumentError, match="neither a PDF nor UTF-8 text"):
            await documents.expand(user(file_part(b"\xff\xfe\x00bin", "x.bin", "text/plain")), ANYONE, None)
        with pytest.raises(InvalidDocumentError, match="media type 'image/png'"):
            await documents.expand(user(file_part(b"abc", "x.png", "image/png")), ANYONE, None)
    finally:
        await documents.workers.close()


class FakeFiles:
    """/v1/files as the stage reads it: one file, owned by key `b"k1"`."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def retrieve(self, file_id: str, caller: Caller) -> dict[str, Any]:
        if file_id != "file-1" or caller.key_digest != b"k1":
            raise ObjectNotFoundError(f"No such file: {file_id!r}.", param="file_id")
        return {"id": file_id, "filename": "report.pdf", "bytes": len(self.data)}

    def content(self, file_id: str, caller: Caller):
        self.retrieve(file_id, caller)
        yield self.data


async def test_file_id_reads_the_callers_upload_and_another_keys_is_not_found(stage):
    stage.files = FakeFiles(pdfs.numbered_pdf(1))
    by_id = {"type": "file", "file": {"file_id": "file-1"}}
    expanded = await stage.expand(user(by_id), Caller(b"k1"), None)
    assert texts(expanded.messages)[1].startswith("[document report.pdf, page 1 of 1]\nMarker001")
    with pytest.raises(ObjectNotFoundError):
        await stage.expand(user(by_id), Caller(b"k2"), None)


async def test_file_url_goes_through_the_image_urls_ssrf_guard(stage):
    local = {"type": "file", "file": {"file_url": "http://127.0.0.1:9/a.pdf"}}
    with pytest.raises(InvalidDocumentError, match=r"Document URL host '127.0.0.1' is a loopback address"):
        await stage.expand(user(local), ANYONE, None)
    with pytest.raises(InvalidDocumentError, match="Document URL scheme 'file' is not supported"):
        await stage.expand(user({"type": "file", "file": {"file_url": "file:///etc/passwd"}}), ANYONE, None)


async def test_a_page_image_is_captioned_in_place_or_named_unseen_when_the_captioner_is_down(stage):
    pdf = pdfs.pdf_with_image_page([pdfs.page_text(1)], [])
    messages = user(file_part(pdf))
    core = answer_core(FakeDecoder(), FakeCaptioner(), documents=stage)
    seen = await core.vision.prepare(messages, RequestRecord())
    prompt = seen.messages[0].content
    assert "[document a.pdf, page 2 of 2]\nImage 1: a picture for " in prompt
    assert prompt.index("Marker001") < prompt.index("page 2 of 2")
    assert seen.degraded is None

    down = answer_core(FakeDecoder(), FakeCaptioner(down=True), documents=stage)
    blind = await down.vision.prepare(messages, RequestRecord())
    assert blind.degraded is not None
    report = blind.degraded.report
    assert report.unseen_images == []
    assert [(p.filename, p.page, p.reason) for p in report.unseen_pages] == [("a.pdf", 2, "captioner_unavailable")]
    assert "This page has no text layer, and it could not be seen (the vision model is unavailable)" in (
        blind.messages[0].content
    )


async def test_pages_left_out_are_reported_without_the_captioners_header():
    documents = DocumentStage(DocumentInputConfig(max_chars_per_request=10), ImageInputConfig())
    core = answer_core(FakeDecoder(), None, documents=documents)
    try:
        seen = await core.vision.prepare(user(file_part(pdfs.numbered_pdf(2))), RequestRecord())
    finally:
        await documents.workers.close()
    assert seen.degraded is not None and seen.degraded.headers == {}
    assert [p.page for p in seen.degraded.report.unseen_pages] == [1, 2]
    assert seen.degraded.report.model_dump()["unseen_images"] == []


async def test_a_model_without_a_document_stage_refuses_documents():
    core = answer_core(FakeDecoder(), None)
    with pytest.raises(Exception, match="This server reads no documents"):
        await core.vision.prepare(user(file_part(b"hi", "a.txt", "text/plain")), RequestRecord())


async def test_a_native_vlm_gets_the_page_image_in_its_slot_within_its_own_limit(stage):
    pdf = pdfs.pdf_with_image_page([pdfs.page_text(1)], [])
    core = answer_core(FakeDecoder(), None, native_max_images=1, documents=stage)
    seen = await core.vision.prepare(user(file_part(pdf), file_part(pdf, "b.pdf")), RequestRecord())
    assert len(seen.images) == 1 and seen.images[0].data.startswith(b"\x89PNG")
    assert [part.type for part in seen.messages[0].parts or []].count("image") == 1
    assert seen.degraded is not None
    assert [(p.filename, p.page, p.reason) for p in seen.degraded.report.unseen_pages] == [
        ("b.pdf", 2, "over_image_limit")
    ]


def test_each_apis_document_becomes_chats_file_part():
    from deployments.ingress.apis.messages.chat_form import chat_messages as from_messages
    from deployments.ingress.apis.responses.items import chat_messages as from_responses
    from deployments.protocol.anthropic import MessagesInput
    from deployments.protocol.openai.responses import ResponseRequest

    pdf = {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}
    body = MessagesInput.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "document", "source": pdf}]},
                        {
                            "type": "document",
                            "title": "n.txt",
                            "context": "notes",
                            "source": {"type": "text", "data": "hi"},
                        },
                        {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}},
                        {"type": "document", "source": {"type": "file", "file_id": "file-1"}},
                    ],
                },
            ],
        }
    )
    chat = from_messages(body)
    assert [m.role for m in chat] == ["user", "assistant", "tool", "user"]
    parts = chat[3].content
    files = [part.file for part in parts if part.type == "file"]  # type: ignore[union-attr]
    assert files[0].file_data == "data:application/pdf;base64,JVBERi0="
    assert (files[1].filename, files[1].file_data) == ("n.txt", "data:text/plain;base64,aGk=")
    assert parts[1].text == "notes"  # type: ignore[union-attr]  # the context, before its document
    assert files[2].file_url == "https://example.com/a.pdf" and files[3].file_id == "file-1"

    request = ResponseRequest.model_validate(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": [{"type": "input_file", "file_id": "file-1", "filename": "r.pdf"}]},
                {"type": "function_call", "call_id": "c1", "name": "open", "arguments": "{}"},
                {
                    "type": "function_call_output",
                    "call_id": "c1",
                    "output": [{"type": "input_file", "file_data": "aGk="}],
                },
            ],
        }
    )
    chat = from_responses(request, [])
    assert chat[0].content[0].file.file_id == "file-1"  # type: ignore[union-attr]
    assert chat[2].content == "(attached below)"
    assert chat[3].content[0].text == "The attachments that the tool results above returned:"  # type: ignore[union-attr]
    assert chat[3].content[1].file.file_data == "aGk="  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="exactly one of file_data, file_id, file_url"):
        MESSAGES.validate_python([{"role": "user", "content": [{"type": "file", "file": {"filename": "x"}}]}])


def test_a_worker_dies_with_the_process_that_started_it():
    """A replica killed while its worker reads leaves no worker behind: here the worker's input stays
    open (this test holds the pipe's other end), so only the parent-death signal ends it."""
    import subprocess
    import sys
    import time

    import psutil

    from deployments.ingress.documents.reader import WORKER

    read_end, write_end = os.pipe()
    start = (
        "import subprocess, sys, time; "
        f"subprocess.Popen([sys.executable, '-I', {str(WORKER)!r}, '256'], stdin={read_end}); time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", start], pass_fds=(read_end,))
    os.close(read_end)
    try:
        deadline = time.monotonic() + 20
        while not (children := psutil.Process(parent.pid).children()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert children, "the worker did not start"
        time.sleep(1)  # past its start: the signal is set before pypdfium2 loads
        parent.kill()
        parent.wait()
        gone, _ = psutil.wait_procs(children, timeout=10)
        assert gone, "the worker outlived the process that started it"
    finally:
        parent.kill()
        os.close(write_end)

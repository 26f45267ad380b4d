"""Reading documents (`ingress/documents/`): pages per second of a PDF of text pages read by the
ingress's document stage (PDFium in its worker process, the text marked page by page into the chat),
and the time of the same document again, a cache hit; beside it, pypdf's text extraction of the same
file in this process, when pypdf is installed (the library not chosen: `pip install pypdf`).

The PDF is written by hand here (`--pages` pages of `--lines` lines of about 80 characters, a dense
report page), so the benchmark needs no PDF maker. Each reading runs `--repeats` times: the first
reading starts the worker process (timed apart), the next ones clear the cache first; the cache hit
is the whole stage (hashing the bytes, the lookup, the chat's parts) with the document cached.

Then the hostile cases (issue 67): a one-page PDF's reading alone, and beside a request refused
with a 400 that carried `--slow` slow PDFs (`--slow-pages` pages each, read when it was refused; the
target: within 2x its time alone, where the refused request's PDFs used to stay queued), and a
text document of one 24 MB line (the target: under 0.5 s for the whole stage).

    .venv/bin/python -m scripts.bench documents
    .venv/bin/python -m scripts.bench documents --pages 20 --repeats 2  # a smoke run

Prints one JSON line per measurement.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import platform
import statistics
import time
from typing import Any

from pydantic import TypeAdapter

from deployments.config import DocumentInputConfig, ImageInputConfig
from deployments.errors import InvalidDocumentError
from deployments.ingress.documents.stage import DocumentStage
from deployments.protocol.openai.chat import ChatMessage
from deployments.state.owners import Caller
from scripts.bench.common import arguments, emit

WORDS = [
    "revenue",
    "grew",
    "in",
    "the",
    "third",
    "quarter",
    "while",
    "costs",
    "fell",
    "and",
    "the",
    "outlook",
    "for",
    "spring",
    "hiring",
    "improved",
]


def text_pdf(pages: int, lines: int) -> bytes:
    """A PDF of `pages` pages, each `lines` lines of text in Helvetica, with a correct xref table."""
    font = pages + 3
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(pages))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode()]
    for number in range(pages):
        content = 4 + 2 * number
        rows = []
        for line in range(lines):
            words = [WORDS[(number + line + k) % len(WORDS)] for k in range(13)]
            rows.append(f"(Page {number + 1} line {line + 1}: {' '.join(words)}) '")
        stream = f"BT /F1 9 Tf 40 800 Td 11 TL {' '.join(rows)} ET".encode()
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents {content} 0 R "
            f"/Resources << /Font << /F1 {font} 0 R >> >> >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = bytearray(b"%PDF-1.7\n")
    offsets = []
    for index, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % index + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def file_part(data: bytes, mime: str = "application/pdf", name: str | None = None) -> dict[str, Any]:
    source = {"file_data": f"data:{mime};base64," + base64.b64encode(data).decode()}
    return {"type": "file", "file": {**source, **({"filename": name} if name else {})}}


def chat(*documents: bytes | dict[str, Any]) -> list[ChatMessage]:
    parts = [document if isinstance(document, dict) else file_part(document) for document in documents]
    return TypeAdapter(list[ChatMessage]).validate_python([{"role": "user", "content": parts}])


async def _timed(stage: DocumentStage, messages: list[ChatMessage]) -> float:
    stage.cache = type(stage.cache)(0, 0)  # no cache: every reading is timed
    start = time.perf_counter()
    await stage.expand(messages, Caller(), None)
    return time.perf_counter() - start


async def hostile(repeats: int, slow: int, slow_pages: int) -> list[dict[str, Any]]:
    """A one-page PDF read alone, then right after a request of `slow` slow PDFs and a binary
    "text" document is refused (the 400 comes while the slow PDFs are being read).
    """
    stage = DocumentStage(DocumentInputConfig(), ImageInputConfig())
    small = chat(text_pdf(1, 40))
    slow_pdfs = [file_part(text_pdf(slow_pages, 60 + k)) for k in range(slow)]
    refused = chat(*slow_pdfs, file_part(b"\xff\xfe\x00binary", "text/plain", "bad.txt"))
    results: list[dict[str, Any]] = []
    try:
        await _timed(stage, small)  # the workers started
        alone = statistics.median([await _timed(stage, small) for _ in range(repeats)])
        beside, refusals = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            try:
                await stage.expand(refused, Caller(), None)
            except InvalidDocumentError:
                refusals.append(time.perf_counter() - start)
            beside.append(await _timed(stage, small))
        near = statistics.median(beside)
        results.append({"measure": "one-page PDF alone", "s": round(alone, 4)})
        results.append(
            {
                "measure": f"one-page PDF right after a refused request of {slow} slow PDFs",
                "s": round(near, 4),
                "ratio": round(near / alone, 2),
                "refused_in_s": round(statistics.median(refusals), 4),
                "slow_pdf_pages": slow_pages,
                "target_ratio": 2.0,
            }
        )
        one_line = chat(file_part(b"x" * 24_000_000, "text/plain", "line.txt"))
        line = statistics.median([await _timed(stage, one_line) for _ in range(max(1, repeats // 2))])
        results.append({"measure": "text document of one 24 MB line", "s": round(line, 4), "target_s": 0.5})
    finally:
        await stage.workers.close()
    return results


async def measure(pdf: bytes, pages: int, repeats: int) -> list[dict[str, Any]]:
    config = DocumentInputConfig(max_chars_per_request=100_000_000, max_pages_per_request=max(pages, 1000))
    stage = DocumentStage(config, ImageInputConfig())
    messages = chat(pdf)
    results: list[dict[str, Any]] = []
    try:
        start = time.perf_counter()
        expanded = await stage.expand(messages, Caller(), None)
        first = time.perf_counter() - start
        chars = sum(len(part.text) for part in expanded.messages[0].content if part.type == "text")  # type: ignore[union-attr]
        results.append({"measure": "first reading (starts the worker)", "s": round(first, 4), "chars": chars})
        reads = []
        for _ in range(repeats):
            stage.cache = type(stage.cache)(config.cache_entries, int(config.cache_mb * 1024 * 1024))
            start = time.perf_counter()
            await stage.expand(messages, Caller(), None)
            reads.append(time.perf_counter() - start)
        read = statistics.median(reads)
        results.append({"measure": "reading (worker warm)", "s": round(read, 4), "pages_per_s": round(pages / read, 1)})
        hits = []
        for _ in range(repeats):
            start = time.perf_counter()
            await stage.expand(messages, Caller(), None)
            hits.append(time.perf_counter() - start)
        hit = statistics.median(hits)
        results.append({"measure": "cache hit", "s": round(hit, 5), "speedup": round(read / hit, 1)})
    finally:
        await stage.workers.close()
    return results


def pypdf_reading(pdf: bytes, pages: int, repeats: int) -> dict[str, Any] | None:
    try:
        import pypdf
    except ImportError:
        return None
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        reader = pypdf.PdfReader(io.BytesIO(pdf))
        chars = sum(len(page.extract_text()) for page in reader.pages)
        times.append(time.perf_counter() - start)
    read = statistics.median(times)
    return {
        "measure": "pypdf extract_text, in process",
        "s": round(read, 4),
        "pages_per_s": round(pages / read, 1),
        "chars": chars,
    }


def main(argv: list[str]) -> None:
    parser = arguments("documents", __doc__)
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--lines", type=int, default=60, help="lines of text per page (about 80 characters each)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--slow", type=int, default=8, help="slow PDFs of the refused request")
    parser.add_argument("--slow-pages", type=int, default=110, help="pages of each slow PDF (all under the cap)")
    args = parser.parse_args(argv)
    pdf = text_pdf(args.pages, args.lines)
    machine = {"cores": os.cpu_count(), "cpu": platform.processor() or platform.machine(), "pdf_bytes": len(pdf)}
    emit({"benchmark": "documents", "pages": args.pages, **machine})
    for result in asyncio.run(measure(pdf, args.pages, args.repeats)):
        emit({"benchmark": "documents", "pages": args.pages, **result})
    if (peer := pypdf_reading(pdf, args.pages, args.repeats)) is not None:
        emit({"benchmark": "documents", "pages": args.pages, **peer})
    for result in asyncio.run(hostile(args.repeats, args.slow, args.slow_pages)):
        emit({"benchmark": "documents", "case": "hostile", **result})

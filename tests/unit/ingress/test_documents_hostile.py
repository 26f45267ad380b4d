"""Documents that cannot clog the ingress (issue 67, points 8, 9 and 11), through the real document
stage and its worker processes: a refused request's PDFs are never read (queued) or stopped
(started), one request cannot hold every worker, a full queue is a 503 with Retry-After, one client
leaving never fails another's read of the same document, the page cap is checked from the page trees
before any page is read, and text is cut with bounded memory.

A PDF that "hangs" carries the comment ``%HANG``: a scripted worker (the real one, whose reading
sleeps for an hour on such a PDF; its page count answers at once) stands in for a PDF that is slow
to parse, so that nothing here depends on how fast this machine parses. `reader.WORKER` is swapped
for it, as a replica would start it."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from deployments.config import DocumentInputConfig, ImageInputConfig
from deployments.errors import InvalidDocumentError, OverloadedError, to_openai_error
from deployments.ingress.documents import reader
from deployments.ingress.documents.cache import DocumentCache
from deployments.ingress.documents.reader import Page, ReadDocument, read_text
from deployments.ingress.documents.stage import DocumentStage
from tests.support import pdfs
from tests.unit.ingress.test_documents import ANYONE, file_part, texts, user

GUARD_S = 60  # a test that would wait forever on the old code fails here instead

SCRIPTED_WORKER = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("pdf_worker", {worker!r})
worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker)
real = worker.read_pdf

def read_pdf(data, limits):
    if b"%HANG" in data and not limits.get("count_only"):
        time.sleep(3600)
    return real(data, limits)

worker.read_pdf = read_pdf
worker.main()
"""


def hanging_pdf(number: int, pages: int = 1) -> bytes:
    """A PDF (distinct by `number`) whose reading never ends in the scripted worker."""
    return pdfs.numbered_pdf(pages, words=number + 1) + b"\n%HANG\n"


@pytest.fixture
def scripted_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "worker.py"
    script.write_text(SCRIPTED_WORKER.format(worker=str(reader.WORKER)))
    monkeypatch.setattr(reader, "WORKER", script)


@asynccontextmanager
async def open_stage(**settings: object) -> AsyncIterator[DocumentStage]:
    stage = DocumentStage(DocumentInputConfig(parse_memory_mb=256, **settings), ImageInputConfig())  # type: ignore[arg-type]
    try:
        yield stage
    finally:
        await stage.workers.close()


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait (up to `GUARD_S`) until `condition()` holds (`what`: what it says); no timing is asserted."""
    async with asyncio.timeout(GUARD_S):
        while not condition():
            await asyncio.sleep(0.01)


async def reading(stage: DocumentStage, counts: int, reads: int) -> None:
    """Wait until `reads` PDFs are in workers after `counts` page counts (no timing asserted)."""
    workers = stage.workers
    await until(lambda: workers.stats.started == counts + reads and workers.running == reads, "reading")


async def read_alone(stage: DocumentStage) -> list[str]:
    """A one-page PDF's text through `stage`, as a caller beside the hostile one sees it."""
    async with asyncio.timeout(GUARD_S):
        expanded = await stage.expand(user(file_part(pdfs.numbered_pdf(1), "small.pdf")), ANYONE, None)
    return texts(expanded.messages)


# Point 8 ---------------------------------------------------------------------------------------


@pytest.mark.usefixtures("scripted_worker")
async def test_a_request_refused_for_its_text_reads_none_of_its_pdfs():
    async with open_stage(workers=1) as stage:
        hostile = [file_part(hanging_pdf(n), f"slow{n}.pdf") for n in range(4)]
        binary = file_part(b"\xff\xfe\x00binary", "bad.txt", "text/plain")
        with pytest.raises(InvalidDocumentError, match=r"'bad\.txt' is neither a PDF nor UTF-8 text"):
            await stage.expand(user(*hostile, binary), ANYONE, None)
        assert "Marker001" in (await read_alone(stage))[1]  # the old code waited behind the hanging PDFs
        assert stage.workers.stats.started == 4 + 2  # the page counts; then the small PDF's count and reading


@pytest.mark.usefixtures("scripted_worker")
async def test_a_request_refused_mid_reading_stops_its_other_reads():
    async with open_stage(workers=2) as stage:
        bomb = file_part(pdfs.bomb_pdf(512), "bomb.pdf")  # refused once read: over parse_memory_mb
        hostile = [file_part(hanging_pdf(n), f"slow{n}.pdf") for n in range(3)]
        with pytest.raises(InvalidDocumentError, match=r"'bomb\.pdf' could not be read"):
            await stage.expand(user(bomb, *hostile), ANYONE, None)
        assert (stage.workers.queued, stage.workers.running) == (0, 0)
        assert stage.workers.stats.stopped == 1  # the hanging PDF beside the bomb: its worker killed
        assert "Marker001" in (await read_alone(stage))[1]  # the old code: behind three hanging PDFs


@pytest.mark.usefixtures("scripted_worker")
async def test_a_cancelled_request_stops_its_reads():
    async with open_stage(workers=1) as stage:
        request = asyncio.create_task(stage.expand(user(file_part(hanging_pdf(1), "slow.pdf")), ANYONE, None))
        await reading(stage, counts=1, reads=1)
        request.cancel()  # the client left
        with pytest.raises(asyncio.CancelledError):
            await request
        assert "Marker001" in (await read_alone(stage))[1]
        assert stage.workers.stats.stopped == 1


@pytest.mark.usefixtures("scripted_worker")
async def test_one_request_cannot_hold_every_worker():
    async with open_stage(workers=3) as stage:  # max_reads_per_request: 2
        hostile = [file_part(hanging_pdf(n), f"slow{n}.pdf") for n in range(4)]
        request = asyncio.create_task(stage.expand(user(*hostile), ANYONE, None))
        await reading(stage, counts=4, reads=2)
        try:
            assert "Marker001" in (await read_alone(stage))[1]  # the third worker is free for others
            assert stage.workers.running == 2 and stage.workers.queued == 0  # its others wait on its side
        finally:
            request.cancel()
            await asyncio.gather(request, return_exceptions=True)


@pytest.mark.usefixtures("scripted_worker")
async def test_a_full_queue_is_a_503_with_retry_after_and_reads_nothing():
    async with open_stage(workers=1, max_queued_reads=1) as stage:
        first = asyncio.create_task(stage.expand(user(file_part(hanging_pdf(1), "a.pdf")), ANYONE, None))
        await reading(stage, counts=1, reads=1)
        second = asyncio.create_task(stage.expand(user(file_part(hanging_pdf(2), "b.pdf")), ANYONE, None))
        await until(lambda: stage.workers.queued == 1, "the second PDF queued")
        try:
            with pytest.raises(OverloadedError) as full:
                await stage.expand(user(file_part(pdfs.numbered_pdf(1), "c.pdf")), ANYONE, None)
        finally:
            for task in (first, second):
                task.cancel()
            await asyncio.gather(first, second, return_exceptions=True)
        status, body, headers = to_openai_error(full.value, "req-1")
        assert status == 503 and body["error"]["code"] == "overloaded"
        assert "documents.max_queued_reads" in body["error"]["message"]
        assert int(headers["Retry-After"]) >= 1
        assert (stage.workers.queued, stage.workers.running) == (0, 0)
        assert "Marker001" in (await read_alone(stage))[1]


# Point 9 ---------------------------------------------------------------------------------------

DOCUMENT = ReadDocument("text", (Page("hello"),))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_one_client_leaving_never_fails_anothers_read_of_the_same_document():
    cache = DocumentCache(8, 1 << 20)
    release = asyncio.Event()
    started = 0

    async def read() -> ReadDocument:
        nonlocal started
        started += 1
        await release.wait()
        return DOCUMENT

    first = asyncio.create_task(cache.get_or_make("k", read))
    await settle()
    second = asyncio.create_task(cache.get_or_make("k", read))
    await settle()
    first.cancel()  # the request that started the reading leaves
    await settle()
    release.set()
    assert await second is DOCUMENT  # the old code: CancelledError
    assert first.cancelled() and started == 1 and len(cache) == 1


async def test_a_shared_reading_is_cancelled_when_its_last_waiter_leaves():
    cache = DocumentCache(8, 1 << 20)
    cancelled = asyncio.Event()

    async def read() -> ReadDocument:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return DOCUMENT

    waiters = [asyncio.create_task(cache.get_or_make("k", read)) for _ in range(2)]
    await settle()
    waiters[0].cancel()
    await settle()
    assert not cancelled.is_set()  # one still waits
    waiters[1].cancel()
    await settle()
    assert cancelled.is_set() and cache.in_flight == 0

    async def again() -> ReadDocument:
        return DOCUMENT

    assert await cache.get_or_make("k", again) is DOCUMENT  # a later request reads afresh


# Point 11 --------------------------------------------------------------------------------------


@pytest.mark.usefixtures("scripted_worker")
async def test_the_page_cap_is_checked_from_the_page_trees_before_any_page_is_read():
    async with open_stage(max_pages_per_request=3) as stage:
        two = [file_part(hanging_pdf(n, pages=2), f"p{n}.pdf") for n in range(2)]
        async with asyncio.timeout(GUARD_S):  # the old code read every page first (here: forever)
            with pytest.raises(
                InvalidDocumentError, match=r"have 4 pages \('p0.pdf': 2, 'p1.pdf': 2\); the limit is 3"
            ):
                await stage.expand(user(*two), ANYONE, None)
        assert stage.workers.stats.stopped == stage.workers.stats.dropped == 0  # no reading was begun


def test_a_text_documents_reading_holds_what_the_request_may_read_not_the_whole_document():
    lines = b"a\n" * 1_000_000  # a million short lines
    config = DocumentInputConfig(max_chars_per_request=10_000, text_part_chars=4000)
    tracemalloc.start()
    try:
        document = read_text(lines, "lines.txt", config, param="p")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    kept = [page.text for page in document.pages if page.text is not None]
    assert len(document.pages) == 500 and sum(map(len, kept)) <= 10_000 + 4000
    assert peak < 12 * len(lines)  # the old code held a string per line: over 50 bytes each


def test_a_long_line_is_cut_at_the_part_size_and_lines_are_kept_whole():
    config = DocumentInputConfig(text_part_chars=10)
    one_line = read_text(b"x" * 25, "x.txt", config, param="p")
    assert [page.text for page in one_line.pages] == ["x" * 10, "x" * 10, "x" * 5]
    mixed = read_text(b"ab\ncd\n" + b"y" * 12 + b"\nz\r\nw", "m.txt", config, param="p")
    assert [page.text for page in mixed.pages] == ["ab\ncd", "y" * 10, "yy\nz\nw"]

"""Documents and vision over one room below both (issue 69): the document stage imports nothing
from the image pipeline (and the shared room nothing from either), a rendered page reaches the
captioner as its bytes (no base64 on the way, the same checks and cache keys as any image), and the
document cache's hits, misses and size are exported as metrics beside the caption cache's."""

from __future__ import annotations

import ast
import base64
import hashlib
import io
from pathlib import Path

import pytest
from PIL import Image

from deployments.config import DocumentInputConfig, ImageInputConfig
from deployments.errors import InvalidImageError
from deployments.ingress.documents.stage import DocumentStage
from deployments.monitoring.access_log import RequestRecord
from tests.support import pdfs
from tests.unit.ingress.fakes import FakeCaptioner, FakeDecoder, answer_core
from tests.unit.ingress.test_documents import ANYONE, file_part, user

INGRESS = Path(__file__).resolve().parents[3] / "deployments" / "ingress"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def imports(module: Path) -> set[str]:
    """Every module `module` imports (under TYPE_CHECKING too), by its dotted name."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


@pytest.mark.parametrize(
    ("room", "below"),
    [("documents", ("documents", "media")), ("media", ("media",))],
)
def test_documents_and_the_shared_room_import_nothing_above_them(room, below):
    for module in sorted((INGRESS / room).glob("*.py")):
        ingress = {name for name in imports(module) if name.startswith("deployments.ingress.")}
        rooms = {name.split(".")[2] for name in ingress}
        assert rooms <= {*below, "handles"}, f"{module.name} imports {sorted(ingress)}"
    fit = imports(INGRESS / "documents" / "fit.py")
    assert not any(name.startswith("deployments.ingress.documents.stage") for name in fit)  # no fit <-> stage circle


@pytest.fixture
async def stage():
    documents = DocumentStage(DocumentInputConfig(parse_memory_mb=256), ImageInputConfig())
    yield documents
    await documents.workers.close()


async def test_a_page_reaches_the_captioner_as_its_bytes_never_through_base64(stage, monkeypatch):
    pdf = pdfs.pdf_with_image_page([pdfs.page_text(1)], [])
    messages = user(file_part(pdf))  # the PDF's own data URL is encoded here, before counting
    crossings: list[str] = []
    encode, decode = base64.b64encode, base64.b64decode

    def counted_encode(data, *args, **kwargs):
        if bytes(data[:8]) == PNG_MAGIC:
            crossings.append("encoded")
        return encode(data, *args, **kwargs)

    def counted_decode(data, *args, **kwargs):
        out = decode(data, *args, **kwargs)
        if out[:8] == PNG_MAGIC:
            crossings.append("decoded")
        return out

    monkeypatch.setattr(base64, "b64encode", counted_encode)
    monkeypatch.setattr(base64, "b64decode", counted_decode)
    captioner = FakeCaptioner()
    core = answer_core(FakeDecoder(), captioner, documents=stage)
    record = RequestRecord()
    seen = await core.vision.prepare(messages, record)
    assert crossings == []  # the old code: decoded (reader), encoded (stage), decoded (image check)
    ((page,),) = captioner.calls
    assert page.data.startswith(PNG_MAGIC) and Image.open(io.BytesIO(page.data)).size[1] == 1024
    assert page.digest == hashlib.sha256(page.data).hexdigest()  # the caption cache's key, as for any image
    assert record.images.count == 1 and record.images.nbytes == len(page.data)  # counted as an image
    assert "Image 1: a picture for " in seen.messages[0].content


async def test_a_page_over_the_image_caps_is_refused_as_any_image_is(stage):
    pdf = pdfs.pdf_with_image_page([pdfs.page_text(1)], [])
    small = ImageInputConfig(max_image_pixels=1000)
    core = answer_core(FakeDecoder(), FakeCaptioner(), documents=stage, images=small)
    with pytest.raises(InvalidImageError, match=r"the limit is 1000"):
        await core.vision.prepare(user(file_part(pdf)), RequestRecord())


class Sink:
    """The ingress's metrics as the stage records them: counters added up, gauges as last set."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}

    def inc(self, name: str, value: float = 1.0) -> None:
        self.values[name] = self.values.get(name, 0) + value

    def set(self, name: str, value: float) -> None:
        self.values[name] = value


async def test_the_document_cache_is_exported_as_metrics():
    sink = Sink()
    stage = DocumentStage(DocumentInputConfig(), ImageInputConfig(), metrics=sink)
    text = file_part(b"a line\n" * 10, "a.txt", "text/plain")
    await stage.expand(user(text), ANYONE, None)
    await stage.expand(user(text, text), ANYONE, None)
    assert sink.values == {
        "document_cache_hits": 2,
        "document_cache_misses": 1,
        "document_cache_entries": 1,
        "document_cache_bytes": stage.cache.bytes,
    }
    assert stage.cache.bytes > 0

"""PDFs made at test time: text pages (fpdf2, a test dependency), a page that is only an image, an
encrypted one, and hostile ones written by hand (malformed, deep nesting, a page tree and a form that
contain themselves, a content stream that inflates to hundreds of MB)."""

from __future__ import annotations

import functools
import io
import zlib

from fpdf import FPDF
from PIL import Image, ImageDraw


def _pdf() -> FPDF:
    pdf = FPDF()
    pdf.set_font("helvetica", size=11)
    return pdf


def page_text(number: int, words: int = 40) -> str:
    """The text of page `number` of `text_pdf`'s documents: its marker word, then filler."""
    return f"Marker{number:03d} " + " ".join(["lorem"] * words)


def text_pdf(pages: list[str]) -> bytes:
    """A PDF with one page per string, each written as it is."""
    pdf = _pdf()
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 6, text)
    return bytes(pdf.output())


def numbered_pdf(count: int, words: int = 40) -> bytes:
    """`count` text pages, page n starting with ``MarkerNNN``."""
    return text_pdf([page_text(n, words) for n in range(1, count + 1)])


def picture() -> Image.Image:
    """A drawn picture: a red disc on a blue square (no text)."""
    image = Image.new("RGB", (240, 240), (30, 60, 200))
    ImageDraw.Draw(image).ellipse((40, 40, 200, 200), fill=(220, 30, 30))
    return image


def pdf_with_image_page(before: list[str], after: list[str]) -> bytes:
    """Text pages, then a page that is only a picture (no text layer), then more text pages."""
    pdf = _pdf()
    for text in before:
        pdf.add_page()
        pdf.multi_cell(0, 6, text)
    pdf.add_page()
    buffer = io.BytesIO()
    picture().save(buffer, format="PNG")
    pdf.image(buffer, x=30, y=30, w=150)
    for text in after:
        pdf.add_page()
        pdf.multi_cell(0, 6, text)
    return bytes(pdf.output())


def encrypted_pdf() -> bytes:
    """A PDF that needs a user password to open."""
    pdf = _pdf()
    pdf.set_encryption(owner_password="owner", user_password="secret")
    pdf.add_page()
    pdf.multi_cell(0, 6, "The secret plan.")
    return bytes(pdf.output())


def malformed_pdf() -> bytes:
    """A PDF header, then garbage: no objects, no cross-reference table."""
    return b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj << /Type /Catalog /Pages 2 0 R\n\x00\xff garbage" * 3


def raw_pdf(objects: list[bytes]) -> bytes:
    """A PDF of these objects (numbered from 1; object 1 is the catalog) with a correct xref table."""
    out = bytearray(b"%PDF-1.7\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def _stream(content: bytes, extra: bytes = b"") -> bytes:
    return b"<< /Length %d %s >>\nstream\n" % (len(content), extra) + content + b"\nendstream"


_FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"


def one_page_pdf(content: bytes, filters: bytes = b"", resources: bytes = b"/Font << /F1 5 0 R >>") -> bytes:
    """One page whose content stream is `content` (already encoded by `filters`)."""
    return raw_pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << %s >> >>" % resources,
            _stream(content, filters),
            _FONT,
        ]
    )


@functools.cache
def bomb_pdf(megabytes: int = 512) -> bytes:
    """One page whose content stream is `megabytes` MB of spaces deflated to about a thousandth."""
    deflate = zlib.compressobj(9)
    chunk = b" " * (1 << 20)
    packed = b"".join(deflate.compress(chunk) for _ in range(megabytes)) + deflate.flush()
    return one_page_pdf(packed, b"/Filter /FlateDecode")


def deep_pdf(depth: int = 100_000) -> bytes:
    """A page whose resources hold arrays nested `depth` deep."""
    nested = b"[" * depth + b"]" * depth
    return one_page_pdf(b"BT /F1 12 Tf 72 700 Td (deep) Tj ET", resources=b"/Font << /F1 5 0 R >> /X " + nested)


def cyclic_pdf() -> bytes:
    """A page tree whose node lists itself among its kids, and a form that draws itself."""
    form = _stream(b"/Fm1 Do", b"/Type /XObject /Subtype /Form /BBox [0 0 100 100] /Resources 6 0 R")
    return raw_pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [2 0 R 3 0 R] /Count 2 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources 6 0 R >>",
            _stream(b"/Fm1 Do"),
            form,
            b"<< /XObject << /Fm1 5 0 R >> >>",
        ]
    )

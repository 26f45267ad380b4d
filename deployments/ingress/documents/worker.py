"""The PDF reader's worker process: PDF bytes in, each page's text (and, for a page with little or no
text, the page rendered as a PNG) out. Run as a script by `reader.DocumentWorkers`, never imported by
the ingress for its work: it holds the untrusted parsing, so that a hostile file costs this process
and never the ingress.

PDFium (pypdfium2: Chrome's PDF engine, continuously fuzzed, Apache-2.0/BSD, binary wheels; text
extraction about 3x pypdf's speed here, and it renders pages, which pypdf cannot) parses under
limits set before the first file is read: RLIMIT_AS caps the memory the process may map beyond what it
holds at start (a decompression bomb or a huge stream fails there: PDFium aborts, the parent sees the
process die and answers a 400), no core dumps, no file writes. The parent kills it past its deadline.

Framing on stdin/stdout (no pickle: the parent never unpickles what a process that parsed hostile
bytes wrote): a request is a 4-byte big-endian length, a JSON object of limits, an 8-byte length and
the PDF's bytes; an answer is an 8-byte length and a JSON object, ``{"ok": true, "page_count": n,
"pages": [{"text": str | null, "image": int | null}]}``, then an 8-byte length and the pages' PNGs,
one after the other, each as many bytes as its page's ``image`` says (raw bytes: no base64 on the
way to the image pipeline). ``text`` null: a page not read, past `max_chars`; no ``pages`` when the
limits say ``count_only``: the page count alone, from the page tree, before the parent lets any page
of the request be read. A refusal is ``{"ok": false, "error": "encrypted" | "malformed" |
"too_many_pages" | "memory", "pages": n}`` and no PNGs.
"""

from __future__ import annotations

import io
import json
import os
import re
import resource
import signal
import sys
from typing import Any, BinaryIO

_SPACES = re.compile(r"[ \t\u00a0]+\n")
_BLANK_LINES = re.compile(r"\n{3,}")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def clean_text(text: str) -> str:
    r"""A page's text as the prompt takes it: ``\n`` line ends, no control characters, no trailing
    spaces, at most one blank line in a row.
    """
    text = _CONTROL.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    return _BLANK_LINES.sub("\n\n", _SPACES.sub("\n", text)).strip()


def read_pdf(data: bytes, limits: dict[str, Any]) -> dict[str, Any]:
    """The answer for one PDF (see the module's docstring): `limits` are `max_pages`, `max_chars`
    (pages past this many characters are not read), `min_page_chars`, `render_max_side`,
    `max_rendered_pages` and `count_only` (true: the page count, no page read).
    """
    import pypdfium2 as pdfium

    try:
        document = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as exc:
        return {"ok": False, "error": "encrypted" if "password" in str(exc).lower() else "malformed"}
    try:
        count = len(document)  # from the page tree: no page is loaded
        if count > limits["max_pages"]:
            return {"ok": False, "error": "too_many_pages", "pages": count}
        if limits.get("count_only"):
            return {"ok": True, "page_count": count}
        pages: list[dict[str, Any]] = []
        chars = rendered = 0
        for index in range(count):
            if chars > limits["max_chars"]:
                pages.append({"text": None, "image": None})
                continue
            page = document[index]
            try:
                textpage = page.get_textpage()
                text = clean_text(textpage.get_text_range())
                textpage.close()
                image = None
                if len(text) < limits["min_page_chars"] and rendered < limits["max_rendered_pages"]:
                    image = _render(page, limits["render_max_side"])
                    rendered += 1
            finally:
                page.close()
            chars += len(text)
            pages.append({"text": text, "image": image})
        return {"ok": True, "page_count": count, "pages": pages}
    finally:
        document.close()


def _render(page: Any, max_side: int) -> bytes:
    """The page as a PNG, its longer side `max_side` pixels."""
    width, height = page.get_size()
    scale = max_side / max(width, height, 1.0)
    image = page.render(scale=scale).to_pil()
    out = io.BytesIO()
    image.convert("RGB").save(out, format="PNG", optimize=False)
    return out.getvalue()


def _mapped_bytes() -> int:
    """The process's virtual size now (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def limit_process(memory_mb: int) -> None:
    """Memory beyond the current mapping capped at `memory_mb`; no core files, no file writes."""
    cap = _mapped_bytes() + memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    data = stream.read(size)
    return data if len(data) == size else None


def serve(stdin: BinaryIO, stdout: BinaryIO) -> None:
    """Answer requests until stdin ends."""
    while (head := _read_exactly(stdin, 4)) is not None:
        limits = json.loads(_read_exactly(stdin, int.from_bytes(head, "big")) or b"{}")
        size = _read_exactly(stdin, 8)
        data = _read_exactly(stdin, int.from_bytes(size, "big")) if size else None
        if data is None:
            return
        try:
            answer = read_pdf(data, limits)
        except MemoryError:
            answer = {"ok": False, "error": "memory"}
        except Exception:  # PDFium's refusal of a page, an object it cannot load
            answer = {"ok": False, "error": "malformed"}
        _write(stdout, answer)


def _write(stdout: BinaryIO, answer: dict[str, Any]) -> None:
    """One framed answer: the JSON, each page's PNG as its length, then the PNGs' bytes."""
    images = []
    for page in answer["pages"] if answer.get("ok") and "pages" in answer else ():
        if page.get("image") is not None:
            images.append(page["image"])
            page["image"] = len(page["image"])
    body = json.dumps(answer).encode()
    stdout.write(len(body).to_bytes(8, "big") + body)
    stdout.write(sum(map(len, images)).to_bytes(8, "big"))
    for image in images:
        stdout.write(image)
    stdout.flush()


def die_with_parent(parent: int) -> None:
    """Killed as soon as the ingress replica that started it dies (Linux's parent-death signal), even
    in the middle of a file whose reading would outlast it: no worker outlives its replica.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the signal was set
        os._exit(0)


def main() -> None:
    """A worker process's entry: it answers the read requests on stdin, within the memory limit given as its
    argument, until its parent goes.
    """
    die_with_parent(os.getppid())
    import pypdfium2  # noqa: F401  (loaded before the limit: the limit is for parsing)
    from PIL import Image  # noqa: F401

    answers = os.fdopen(os.dup(1), "wb")  # the framed answers; anything the library prints goes to stderr
    os.dup2(2, 1)
    limit_process(int(sys.argv[1]))
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()

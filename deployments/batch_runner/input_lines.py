"""A batch's input lines as the file check (`validation.py`) and the runner (`job.py`) read them: split
in time linear in the bytes, each over the cap (`server.max_body_bytes`, as for an HTTP request) a
`LongLine` never held whole, each parsed into its custom_id and body or the `BatchError` of that line
alone. The runner reads them a few at a time in a thread (`read_ahead`), so that its event loop never
waits on a file.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, overload

from deployments.config import ServerConfig
from deployments.protocol.openai.batches import BatchError, output_line
from deployments.state.storage import Storage


@dataclass(frozen=True)
class LongLine:
    """A line longer than the reader's cap, in place of its bytes (skipped, never held whole)."""

    size: int  # bytes, without the line end
    limit: int  # the cap it passed


@overload
def lines(storage: Storage, path: str, max_line_bytes: None = None) -> Iterator[tuple[int, bytes]]: ...
@overload
def lines(storage: Storage, path: str, max_line_bytes: int) -> Iterator[tuple[int, bytes | LongLine]]: ...
def lines(storage: Storage, path: str, max_line_bytes: int | None = None) -> Iterator[tuple[int, bytes | LongLine]]:
    """The object's lines, numbered from 1, without their line ends, read a chunk at a time in time
    linear in the bytes (each chunk searched once, a line's pieces joined once). Blank lines are
    skipped (their numbers still count). With `max_line_bytes`, a longer line is a `LongLine` (its
    number, its size): its bytes are skipped to its end, so at most a chunk and the cap are held;
    without it, a chunk and the longest line.
    """
    cap = sys.maxsize if max_line_bytes is None else max_line_bytes
    pieces: list[bytes] = []  # the line read so far, from earlier chunks (none once it is over the cap)
    held = 0  # its size
    number = 0
    for chunk in storage.chunks(path):
        *complete, rest = chunk.split(b"\n")
        for end in complete:
            number += 1
            if held:  # the end of a line begun in earlier chunks
                if held + len(end) > cap:
                    yield number, LongLine(held + len(end), cap)
                elif not (line := b"".join((*pieces, end))).isspace():
                    yield number, line.rstrip(b"\r")
                pieces, held = [], 0
            elif len(end) > cap:
                yield number, LongLine(len(end), cap)
            elif end and not end.isspace():
                yield number, end.rstrip(b"\r")
        held += len(rest)
        if held > cap:
            pieces = []
        elif rest:
            pieces.append(rest)
    if held > cap:
        yield number + 1, LongLine(held, cap)
    elif held and not (line := b"".join(pieces)).isspace():
        yield number + 1, line.rstrip(b"\r")


def too_large(line: LongLine) -> BatchError:
    """The error of a line longer than the cap (read as `LongLine`, never held whole)."""
    return BatchError(
        code="line_too_large",
        message=f"This line is {line.size} bytes; a line may be at most {line.limit} bytes "
        "(the request-body cap, server.max_body_bytes).",
    )


def parse_line(raw: bytes | LongLine) -> dict[str, Any] | BatchError:
    """A line's JSON object, or why it is none (its `line` left for the caller to set)."""
    if isinstance(raw, LongLine):
        return too_large(raw)
    try:
        line = json.loads(raw)
    except RecursionError:
        return BatchError(code="invalid_json_line", message="This line nests too deeply to parse.")
    except ValueError:  # JSONDecodeError, UnicodeDecodeError, a number of too many digits
        return BatchError(code="invalid_json_line", message="This line is not parseable JSON.")
    if not isinstance(line, dict):
        return BatchError(code="invalid_json_line", message="A line must be a JSON object.")
    return line


def custom_id_of(line: dict[str, Any]) -> str | BatchError:
    """A line's custom_id, or why it has none."""
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return BatchError(
            code="missing_required_parameter", message="custom_id must be a non-empty string.", param="custom_id"
        )
    return custom_id


def body_of(line: dict[str, Any]) -> dict[str, Any] | BatchError:
    """A line's body, or why it has none."""
    body = line.get("body")
    if not isinstance(body, dict):
        return BatchError(code="missing_required_parameter", message="body must be a JSON object.", param="body")
    return body


def read_line(raw: bytes | LongLine) -> tuple[str, dict[str, Any]] | BatchError:
    """What the runner needs of a line: its custom_id and body, or why it has none."""
    line = parse_line(raw)
    if isinstance(line, BatchError):
        return line
    custom_id, body = custom_id_of(line), body_of(line)
    if isinstance(custom_id, BatchError):
        return custom_id
    return body if isinstance(body, BatchError) else (custom_id, body)


MAX_LINE_BYTES: int = ServerConfig.model_fields["max_body_bytes"].default  # server.max_body_bytes, as shipped
READ_AHEAD_LINES = 64  # input lines read (and parsed) per trip to the reading thread
READ_AHEAD_BYTES = 2**20  # or fewer, once this many bytes are read

Read = tuple[str, dict[str, Any]] | BatchError
"""An input line as the runner reads it: its custom_id and body, or why it cannot run."""


def read_ahead(reader: Iterator[tuple[int, bytes | LongLine]]) -> list[tuple[int, Read]]:
    """The next numbered lines of an input file, read and parsed (run in a thread): up to
    `READ_AHEAD_LINES`, fewer once `READ_AHEAD_BYTES` are read; none at the file's end.
    """
    ahead: list[tuple[int, Read]] = []
    size = 0
    for number, raw in reader:
        ahead.append((number, read_line(raw)))
        size += len(raw) if isinstance(raw, bytes) else 0
        if len(ahead) >= READ_AHEAD_LINES or size >= READ_AHEAD_BYTES:
            break
    return ahead


def unreadable_line(number: int, failure: BatchError) -> dict[str, Any]:
    """The error-file line of an input line that could not be read: no custom_id, its `line` number."""
    error = {"code": failure.code, "message": failure.message, "line": number}
    return output_line(None, uuid.uuid4().hex, None, None, error)

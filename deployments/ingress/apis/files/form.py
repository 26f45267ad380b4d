"""/v1/files' multipart form, read as it arrives: its few small fields kept, its file part's bytes
handed on a piece at a time (at most `CHUNK_BYTES` each), so that an upload goes to the storage root
without being held, in memory or in a temporary file. Fields may come before or after the file (the
openai client sends them first; others, after).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from deployments.errors import InvalidRequestError, PayloadTooLargeError
from deployments.protocol.openai.files import EXPIRES_ANCHOR, EXPIRES_SECONDS
from deployments.state.storage import CHUNK_BYTES

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

FILE_FIELD = "file"
READ_FIELDS = frozenset({"purpose", EXPIRES_ANCHOR, EXPIRES_SECONDS})  # the form's fields the route reads: once each
MAX_FIELDS = 16
MAX_FIELD_BYTES = 4096


class UploadForm:
    """The form of one upload over `body` (its pieces as they arrive), of at most `cap` bytes (413
    beyond). Read in order: `find_file`, then `chunks` (the file's bytes), then `rest` (the fields).
    """

    def __init__(self, body: Iterator[bytes], content_type: str, cap: int) -> None:
        kind, options = parse_options_header(content_type)
        if kind != b"multipart/form-data" or not options.get(b"boundary"):
            raise InvalidRequestError("An upload is a multipart/form-data form with a `file` part.", param="file")
        callbacks: MultipartCallbacks = {
            "on_part_begin": self._begin,
            "on_part_data": self._data,
            "on_part_end": self._end,
            "on_header_field": self._header_field,
            "on_header_value": self._header_value,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
        }
        try:
            self._parser = MultipartParser(options[b"boundary"], callbacks)
        except FormParserError as exc:
            raise _malformed() from exc
        self._body = body
        self._cap = cap
        self._read = 0
        self._done = False
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self._file: Literal["before", "in", "after"] = "before"
        self._pending: list[bytes] = []  # the file's bytes parsed, not yet handed on
        self._part: Literal["file", "field", "other"] = "other"
        self._name = ""
        self._value = bytearray()
        self._header = [bytearray(), bytearray()]
        self._disposition = b""

    def find_file(self) -> bool:
        """Read up to the file part (the fields before it kept); False when the form has none."""
        while self._file == "before" and self._feed():
            pass
        return self._file != "before"

    def chunks(self) -> Iterator[bytes]:
        """The file part's bytes as they arrive."""
        while True:
            while self._pending:
                yield self._pending.pop(0)
            if self._file == "after":
                return
            if not self._feed():
                raise _malformed()

    def rest(self) -> dict[str, str]:
        """Read the form to its end; its fields."""
        while self._feed():
            pass
        return self.fields

    def _feed(self) -> bool:
        """Parse the body's next piece; False at its end."""
        if self._done:
            return False
        piece = next(self._body, None)
        try:
            if piece is None:
                self._done = True
                self._parser.finalize()
                return False
            self._read += len(piece)
            if self._read > self._cap:
                raise PayloadTooLargeError(f"Request body exceeds {self._cap} bytes.")
            self._parser.write(piece)
        except FormParserError as exc:
            raise _malformed() from exc
        return True

    def _begin(self) -> None:
        self._disposition, self._value = b"", bytearray()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._header[0] += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._header[1] += data[start:end]

    def _header_end(self) -> None:
        name, value = (bytes(h) for h in self._header)
        if name.strip().lower() == b"content-disposition":
            self._disposition = value
        self._header = [bytearray(), bytearray()]

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        self._name = options.get(b"name", b"").decode("utf-8", "replace")
        if self._name == FILE_FIELD and self._file == "before":
            self._part, self._file = "file", "in"
            self.filename = options[b"filename"].decode("utf-8", "replace") if b"filename" in options else None
        elif b"filename" in options or self._name == FILE_FIELD:
            raise InvalidRequestError("An upload holds one file, in its `file` part.", param="file")
        else:
            self._part = "field"
            if self._name in self.fields and self._name in READ_FIELDS:
                raise InvalidRequestError(f"The form field {self._name!r} is given twice.", param=self._name)
            if len(self.fields) >= MAX_FIELDS:
                raise InvalidRequestError(f"An upload's form has at most {MAX_FIELDS} fields.")

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._part == "file":
            self._pending.extend(data[at : min(end, at + CHUNK_BYTES)] for at in range(start, end, CHUNK_BYTES))
        elif self._part == "field":
            self._value += data[start:end]
            if len(self._value) > MAX_FIELD_BYTES:
                raise InvalidRequestError(f"The form field {self._name[:64]!r} exceeds {MAX_FIELD_BYTES} bytes.")

    def _end(self) -> None:
        if self._part == "file":
            self._file = "after"
        elif self._part == "field":
            self.fields[self._name] = self._value.decode("utf-8", "replace")
        self._part = "other"


def _malformed() -> InvalidRequestError:
    return InvalidRequestError("The upload is not a well-formed multipart form.", param="file")

"""/v1/files' logic: files kept in the storage root (`storage.py`), each owned by the API key that
uploaded it (`records.py`). A file is its object (`files/<id>.json`) and its bytes
(`file-data/<id>`); the batch runner writes its output and error files the same way."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from deployments.config import BatchesConfig
from deployments.errors import InvalidRequestError, PayloadTooLargeError
from deployments.ingress.apis.files.protocol import FileObject
from deployments.ingress.batches.records import Records, page
from deployments.ingress.batches.storage import Storage, as_chunks
from deployments.ingress.owners import Caller, Owners

UPLOAD_PURPOSES = ("batch", "user_data")


def data_path(file_id: str) -> str:
    return f"file-data/{file_id}"


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


class FileStore:
    """The files of one storage root."""

    def __init__(self, storage: Storage, owners: Owners, config: BatchesConfig) -> None:
        self.storage = storage
        self.records = Records(storage, "files", owners, "file")
        self._config = config

    def create(self, filename: str, data: bytes | Iterable[bytes], purpose: str, caller: Caller) -> dict[str, Any]:
        """Keep an uploaded file (its bytes, or chunks of them: streamed to the storage root, the caps
        checked as they come); its object."""
        if purpose not in UPLOAD_PURPOSES:
            raise InvalidRequestError(
                f"purpose must be one of {', '.join(UPLOAD_PURPOSES)}; got {purpose!r}.", param="purpose"
            )
        file_id, upload = new_file_id(), _Upload(self._config, purpose == "batch")
        self.storage.write(data_path(file_id), upload.checked(data))  # nothing kept when a cap is passed
        return self.keep(file_id, filename, purpose, upload.size, self.records.owners.tag(caller))

    def keep(self, file_id: str, filename: str, purpose: str, size: int, owner: str | None) -> dict[str, Any]:
        """Record the object of a file whose bytes are at `data_path(file_id)`."""
        obj = FileObject(id=file_id, bytes=size, created_at=int(time.time()), filename=filename, purpose=purpose)
        shown = obj.model_dump()
        self.records.save(file_id, {"object": shown, "owner": owner})
        return shown

    def retrieve(self, file_id: str, caller: Caller) -> dict[str, Any]:
        return dict(self.records.owned(file_id, caller)["object"])

    def list(self, caller: Caller, purpose: str | None, limit: int, after: str | None, order: str) -> dict[str, Any]:
        objects = [r["object"] for r in self.records.all(caller)]
        if purpose:
            objects = [o for o in objects if o["purpose"] == purpose]
        objects.sort(key=lambda o: (o["created_at"], o["id"]), reverse=order == "desc")
        return page(objects, limit, after)

    def content(self, file_id: str, caller: Caller) -> Iterator[bytes]:
        """The file's bytes, a chunk at a time."""
        self.records.owned(file_id, caller)
        if self.storage.size(data_path(file_id)) is None:
            return iter(())
        return self.storage.chunks(data_path(file_id))

    def delete(self, file_id: str, caller: Caller) -> dict[str, Any]:
        self.records.owned(file_id, caller)
        self.records.remove(file_id)
        self.storage.delete(data_path(file_id))
        return {"id": file_id, "object": "file", "deleted": True}


class _Upload:
    """An upload's bytes as they pass: its size and lines, against the caps (a batch file's lines only)."""

    def __init__(self, config: BatchesConfig, count_lines: bool) -> None:
        self._config = config
        self._count_lines = count_lines
        self.size = 0
        self._newlines = 0
        self._last = b""

    def checked(self, data: bytes | Iterable[bytes]) -> Iterator[bytes]:
        for chunk in as_chunks(data):
            self.size += len(chunk)
            if self.size > self._config.max_file_bytes:
                raise PayloadTooLargeError(f"The file exceeds {self._config.max_file_bytes} bytes.")
            if chunk:
                self._newlines += chunk.count(b"\n")
                self._last = chunk[-1:]
            lines = self._newlines + (self._last not in (b"", b"\n"))  # a last line without its end counts
            if self._count_lines and lines > self._config.max_file_lines:
                raise InvalidRequestError(
                    f"A batch file holds at most {self._config.max_file_lines} lines; this one has more.", param="file"
                )
            yield chunk

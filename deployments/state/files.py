"""/v1/files' logic: files kept in the storage root (`storage.py`), each owned by the API key that
uploaded it (`records.py`). A file is its object (`files/<id>.json`) and its bytes
(`file-data/<id>`); the batch runner writes its output and error files the same way.

Each key has quotas (`server.batches.max_files_per_key`, `max_bytes_per_key`), counted over its own
files (its index: `Records.mine`), batch output included; an upload over one is refused with OpenAI's
400 (its storage quota's answer). A file may expire (`expires_after`: OpenAI's, a batch file after 30
days by default): once past its `expires_at` it is not found (the 404 of an unknown id) and its bytes
and record are removed, when next reached, or by the sweep that `keep` runs at most once a minute
(an expiry marker `index/expiry/<expires_at>_<id>` per file, so the sweep reads names, not records).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from deployments.config import BatchesConfig
from deployments.errors import InvalidRequestError, ObjectNotFoundError, PayloadTooLargeError
from deployments.protocol.openai.files import FileObject
from deployments.state.owners import Caller, Owners
from deployments.state.records import INDEX, RECORD_ID, Records, page
from deployments.state.storage import Storage, as_chunks

logger = logging.getLogger("ray.serve")

UPLOAD_PURPOSES = ("batch", "user_data")
EXPIRES_AFTER_S = (3600, 30 * 24 * 3600)  # OpenAI's bounds on `expires_after[seconds]`
BATCH_FILE_EXPIRY_S = 30 * 24 * 3600  # OpenAI's default for a file of purpose batch
SWEEP_INTERVAL_S = 60.0
EXPIRY = f"{INDEX}/expiry"


def data_path(file_id: str) -> str:
    """The storage path of an uploaded file's bytes."""
    return f"file-data/{file_id}"


def new_file_id() -> str:
    """A new file id (``file-`` and 32 hex digits)."""
    return f"file-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class ExpiresAfter:
    """OpenAI's `expires_after` of an upload: `seconds` after the anchor (`created_at`, the only one)."""

    anchor: str
    seconds: int

    @classmethod
    def parse(cls, anchor: str | None, seconds: str | int | None) -> ExpiresAfter | None:
        """From the form's `expires_after[anchor]` and `expires_after[seconds]` (None: neither given; the
        anchor may be left out, `created_at` being the only one).
        """
        if anchor is None and seconds is None:
            return None
        if anchor is None:
            anchor = "created_at"
        if anchor != "created_at":
            raise InvalidRequestError(
                f"expires_after[anchor] must be 'created_at'; got {anchor!r}.", param="expires_after[anchor]"
            )
        low, high = EXPIRES_AFTER_S
        try:
            value = int(seconds) if isinstance(seconds, int | str) else None
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise InvalidRequestError(
                f"expires_after[seconds] must be an integer from {low} to {high}; got {seconds!r}.",
                param="expires_after[seconds]",
            )
        return cls(anchor, value)


class FileStore:
    """The files of one storage root."""

    def __init__(self, storage: Storage, owners: Owners, config: BatchesConfig) -> None:
        self.storage = storage
        self.records = Records(storage, "files", owners, "file")
        self.config = config
        self._next_sweep = 0.0

    def create(
        self,
        filename: str,
        data: bytes | Iterable[bytes],
        purpose: str,
        caller: Caller,
        expires_after: ExpiresAfter | None = None,
    ) -> dict[str, Any]:
        """Keep an uploaded file (its bytes, or chunks of them: streamed to the storage root, the caps
        and the caller's quotas checked as they come); its object.
        """
        checked_purpose(purpose)
        return self.accept(self.receive(data, caller, purpose), filename, purpose, caller, expires_after)

    def receive(self, data: bytes | Iterable[bytes], caller: Caller, purpose: str | None) -> Received:
        """Stream an upload's bytes to a new file's place, against the caps and the caller's quotas
        (nothing kept when one is passed); `purpose` None when the form names it after the file (a
        batch file's line cap is then checked by `accept`). Not a file until `accept`ed.
        """
        mine = self._mine(caller)
        used = sum(int(r["object"]["bytes"]) for r in mine)
        self._check_quota(len(mine) + 1, used)
        upload = _Upload(self.config, purpose == "batch", self.config.max_bytes_per_key - used)
        file_id = new_file_id()
        self.storage.write(data_path(file_id), upload.checked(data))  # nothing kept when a cap is passed
        return Received(file_id, upload.size, upload.lines)

    def accept(
        self, received: Received, filename: str, purpose: str | None, caller: Caller, expires_after: ExpiresAfter | None
    ) -> dict[str, Any]:
        """Record a received upload as the caller's file; its bytes removed when the form or a quota
        refuses it (two uploads of one key at once: the second to finish sees the first).
        """
        file_id = received.file_id
        try:
            purpose = checked_purpose(purpose)
            if purpose == "batch" and received.lines > self.config.max_file_lines:
                raise _too_many_lines(self.config)
        except InvalidRequestError:
            self.abandon(received)
            raise
        if expires_after is None and purpose == "batch":
            expires_after = ExpiresAfter("created_at", BATCH_FILE_EXPIRY_S)
        now = int(time.time())
        expires_at = now + expires_after.seconds if expires_after else None
        shown = self.keep(file_id, filename, purpose, received.size, self.records.owners.tag(caller), expires_at, now)
        mine = self._mine(caller)
        try:
            self._check_quota(len(mine), sum(int(r["object"]["bytes"]) for r in mine))
        except InvalidRequestError:
            self._discard(file_id, shown)
            raise
        return shown

    def abandon(self, received: Received) -> None:
        """Remove a received upload's bytes (its form refused)."""
        self.storage.delete(data_path(received.file_id))

    def keep(
        self,
        file_id: str,
        filename: str,
        purpose: str,
        size: int,
        owner: str | None,
        expires_at: int | None = None,
        created_at: int | None = None,
    ) -> dict[str, Any]:
        """Record the object of a file whose bytes are at `data_path(file_id)` (its expiry marker first)."""
        now = int(time.time())
        obj = FileObject(
            id=file_id,
            bytes=size,
            created_at=created_at or now,
            filename=filename,
            purpose=purpose,
            expires_at=expires_at,
        )
        shown = obj.model_dump()
        if expires_at is not None:
            self.storage.write(_expiry_marker(expires_at, file_id), b"")
        self.records.save(file_id, {"object": shown, "owner": owner})
        if time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + SWEEP_INTERVAL_S
            try:
                self.sweep(now)
            except OSError:
                logger.warning("files: the sweep of expired files failed; it is tried again later", exc_info=True)
        return shown

    def _owned(self, file_id: str, caller: Caller) -> dict[str, Any]:
        """The caller's file's object; an expired one is removed and not found, as an unknown id."""
        shown = dict(self.records.owned(file_id, caller)["object"])
        if _expired(shown, int(time.time())):
            self._discard(file_id, shown)
            raise ObjectNotFoundError(f"No such file: {file_id!r}.", param="file_id")
        return shown

    def _mine(self, caller: Caller) -> list[dict[str, Any]]:
        """The caller's records, those expired removed."""
        now = int(time.time())
        mine = []
        for record in self.records.mine(caller):
            if _expired(record["object"], now):
                self._discard(record["object"]["id"], record["object"])
            else:
                mine.append(record)
        return mine

    def _check_quota(self, files: int, size: int) -> None:
        config = self.config
        if files > config.max_files_per_key:
            raise InvalidRequestError(
                f"You have exceeded your file quota: an API key keeps at most {config.max_files_per_key} files. "
                "Delete old files and try again.",
                param="file",
            )
        if size > config.max_bytes_per_key:
            raise _over_bytes(config)

    def _discard(self, file_id: str, shown: dict[str, Any]) -> None:
        """Remove a file: its bytes, its record (with its index marker), then its expiry marker, so that
        the sweep finds again what a crash between them left.
        """
        self.storage.delete(data_path(file_id))
        self.records.remove(file_id)
        if shown.get("expires_at") is not None:
            self.storage.delete(_expiry_marker(int(shown["expires_at"]), file_id))

    def sweep(self, now: int | None = None) -> int:
        """Remove every file whose `expires_at` has passed (any key's): the expiry markers' names, in
        order, up to the first not yet due; the number removed.
        """
        now = int(time.time()) if now is None else now
        removed = 0
        for name in self.storage.names(EXPIRY):
            due, _, file_id = name.partition("_")
            if not due.isdigit() or int(due) > now:
                break
            if not RECORD_ID.fullmatch(file_id):
                continue
            record = self.records.load(file_id)  # None: a removal cut short, finished now
            self._discard(file_id, {"expires_at": int(due)})
            removed += record is not None
        return removed

    def retrieve(self, file_id: str, caller: Caller) -> dict[str, Any]:
        return self._owned(file_id, caller)

    def list(self, caller: Caller, purpose: str | None, limit: int, after: str | None, order: str) -> dict[str, Any]:
        objects = [r["object"] for r in self._mine(caller)]
        if purpose:
            objects = [o for o in objects if o["purpose"] == purpose]
        objects.sort(key=lambda o: (o["created_at"], o["id"]), reverse=order == "desc")
        return page(objects, limit, after)

    def content(self, file_id: str, caller: Caller) -> Iterator[bytes]:
        """The file's bytes, a chunk at a time."""
        self._owned(file_id, caller)
        if self.storage.size(data_path(file_id)) is None:
            return iter(())
        return self.storage.chunks(data_path(file_id))

    def delete(self, file_id: str, caller: Caller) -> dict[str, Any]:
        self._discard(file_id, self._owned(file_id, caller))
        return {"id": file_id, "object": "file", "deleted": True}


@dataclass(frozen=True)
class Received:
    """An upload's bytes in the storage root, not yet a file (`FileStore.accept`)."""

    file_id: str
    size: int
    lines: int


def checked_purpose(purpose: str | None) -> str:
    """An upload's `purpose`; a 400 unless it is one of `UPLOAD_PURPOSES`."""
    if purpose is None or purpose not in UPLOAD_PURPOSES:
        raise InvalidRequestError(
            f"purpose must be one of {', '.join(UPLOAD_PURPOSES)}; got {purpose!r}.", param="purpose"
        )
    return purpose


def _expired(shown: dict[str, Any], now: int) -> bool:
    return shown.get("expires_at") is not None and int(shown["expires_at"]) <= now


def _expiry_marker(expires_at: int, file_id: str) -> str:
    return f"{EXPIRY}/{expires_at:012d}_{file_id}"  # zero-padded: the names sort by time


def _too_many_lines(config: BatchesConfig) -> InvalidRequestError:
    return InvalidRequestError(
        f"A batch file holds at most {config.max_file_lines} lines; this one has more.", param="file"
    )


def _over_bytes(config: BatchesConfig) -> InvalidRequestError:
    return InvalidRequestError(
        f"You have exceeded your file storage quota: an API key keeps at most {config.max_bytes_per_key} bytes "
        "of files. Delete old files or upload a smaller one.",
        param="file",
    )


class _Upload:
    """An upload's bytes as they pass: its size and lines, against the caps (the line cap where
    `batch` says the file is a batch file) and the key's bytes left (`allowance`).
    """

    def __init__(self, config: BatchesConfig, batch: bool, allowance: int) -> None:
        self._config = config
        self._batch = batch
        self._allowance = allowance
        self.size = 0
        self._newlines = 0
        self._last = b""

    @property
    def lines(self) -> int:
        return self._newlines + (self._last not in (b"", b"\n"))  # a last line without its end counts

    def checked(self, data: bytes | Iterable[bytes]) -> Iterator[bytes]:
        for chunk in as_chunks(data):
            self.size += len(chunk)
            if self.size > self._config.max_file_bytes:
                raise PayloadTooLargeError(f"The file exceeds {self._config.max_file_bytes} bytes.")
            if self.size > self._allowance:
                raise _over_bytes(self._config)
            if chunk:
                self._newlines += chunk.count(b"\n")
                self._last = chunk[-1:]
            if self._batch and self.lines > self._config.max_file_lines:
                raise _too_many_lines(self._config)
            yield chunk

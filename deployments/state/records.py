"""Owned records in the storage root: a file's or a batch's object as JSON, with its owner's tag
(`state.owners`: found only by the API key that made it; to any other key it does not exist, the
same 404 as an unknown id, the refusal logged with the request's id). The tags' secret is kept in the
storage root too (`owners.secret`), so that what a key made stays its own after a restart.

Each record has a marker in its owner's index (`index/<folder>/<tag, or "anon">/<id>`, empty):
written before the record and removed after it, so that a list (and a quota) reads only the
caller's records. A root written before the index existed is indexed once, when a store opens on it
(`Records.index_existing`).
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from deployments.errors import ObjectNotFoundError
from deployments.state.owners import Caller, Owners, refused
from deployments.state.storage import Storage

SECRET = "owners.secret"
INDEX = "index"
ANONYMOUS = "anon"  # the index folder of what was stored with no keys set (a tag is 64 hex digits)
INDEXED_KEPT = 4096  # ids whose marker a process remembers having written (a record saved again skips it)
RECORD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")  # what this service issues (`file-...`, `batch_...`)


def stored_owners(storage: Storage) -> Owners:
    """The owner tags of this storage root, under the secret kept there: made by the first to need it,
    created only where there is none, then read back, so that replicas that start together (the
    ingress and the batch runner) settle on one.
    """
    storage.create(SECRET, secrets.token_bytes(32))
    secret = storage.read(SECRET)
    if not secret:
        raise OSError(f"the storage root's {SECRET} is empty")
    return Owners(secret)


class Records:
    """The records of one kind (`kind`: "file", "batch") under `folder`, as `<id>.json`:
    `{"object": ..., "owner": tag, ...}` (more keys as the kind keeps them).
    """

    def __init__(self, storage: Storage, folder: str, owners: Owners, kind: str) -> None:
        self.storage = storage
        self.folder = folder
        self.owners = owners
        self.kind = kind
        self._indexed: set[str] = set()  # ids whose marker this process has written

    def _path(self, record_id: str) -> str:
        return f"{self.folder}/{record_id}.json"

    def _index(self, owner: str | None) -> str:
        return f"{INDEX}/{self.folder}/{owner or ANONYMOUS}"

    def save(self, record_id: str, record: dict[str, Any]) -> None:
        """Write the record, its owner's index marker first (a marker without its record is skipped)."""
        if record_id not in self._indexed:
            self.storage.write(f"{self._index(record.get('owner'))}/{record_id}", b"")
            if len(self._indexed) >= INDEXED_KEPT:  # a long-lived replica's: forget, and write a marker again
                self._indexed.clear()
            self._indexed.add(record_id)
        self.storage.write(self._path(record_id), json.dumps(record).encode())

    def load(self, record_id: str) -> dict[str, Any] | None:
        """The record (any owner's), None when unknown or its id is not one of ours."""
        if not RECORD_ID.fullmatch(record_id):
            return None  # never a path: no id of ours has a slash, a dot or a null byte
        data = self.storage.read(self._path(record_id))
        return None if data is None else dict(json.loads(data))

    def owned(self, record_id: str, caller: Caller) -> dict[str, Any]:
        """The caller's record; `ObjectNotFoundError` for an unknown id and another owner's (logged)."""
        record = self.load(record_id)
        if record is not None and not self.owners.owns(record.get("owner"), caller):
            refused(self.kind, record_id, caller)
            record = None
        if record is None:
            raise ObjectNotFoundError(f"No such {self.kind}: {record_id!r}.", param=f"{self.kind}_id")
        return record

    def mine(self, caller: Caller) -> list[dict[str, Any]]:
        """The caller's records, in no particular order: read through its index, no one else's."""
        found = []
        for record_id in self.storage.names(self._index(self.owners.tag(caller))):
            record = self.load(record_id)
            if record is not None and self.owners.owns(record.get("owner"), caller):
                found.append(record)
        return found

    def remove(self, record_id: str) -> None:
        """Remove the record, then its index marker."""
        record = self.load(record_id)
        self.storage.delete(self._path(record_id))
        if record is not None:
            self.storage.delete(f"{self._index(record.get('owner'))}/{record_id}")
        self._indexed.discard(record_id)

    def index_existing(self) -> None:
        """Index the records of a root written before the index existed: once per root (a marker
        `index/<folder>.indexed` says it was done; replicas that start together may both do it).
        """
        done = f"{INDEX}/{self.folder}.indexed"
        if self.storage.size(done) is not None:
            return
        for name in self.storage.names(self.folder):
            record = self.load(name.removesuffix(".json")) if name.endswith(".json") else None
            if record is not None:
                self.storage.write(f"{self._index(record.get('owner'))}/{name.removesuffix('.json')}", b"")
        self.storage.create(done, b"")


def page(objects: list[dict[str, Any]], limit: int, after: str | None) -> dict[str, Any]:
    """OpenAI's list object: the objects (already ordered) after the one `after` names, at most `limit`."""
    ids = [o["id"] for o in objects]
    start = ids.index(after) + 1 if after in ids else 0
    data = objects[start : start + limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + limit < len(objects),
    }

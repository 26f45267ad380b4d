"""/v1/batches' logic on the ingress side: a batch created (its record in the storage root, status
`validating`), read, listed and cancelled, each for the API key that created it (`records.py`).

The batch runner (`runner.py`) is the one writer of a batch's record once created: a cancel is a
marker beside the record (`batches/<id>.cancel`), which the runner sees within
`server.batches.poll_interval_s` (at once when woken); until it acts, the batch reads `cancelling`.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from deployments.config import BatchesConfig
from deployments.errors import InvalidRequestError
from deployments.state.files import FileStore
from deployments.state.owners import Caller, Owners
from deployments.state.records import Records, page, stored_owners
from deployments.state.storage import Storage

logger = logging.getLogger("ray.serve")

TERMINAL: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})  # a batch's last states
KeyName = tuple[str, str]  # a key as the limits name it: its entry's name, its own queue (`limits.table.KeyIdentity`)


def cancel_marker(batch_id: str) -> str:
    """The storage path whose presence asks the runner to cancel batch `batch_id`."""
    return f"batches/{batch_id}.cancel"


class BatchStore:
    """The batches of one storage root (the files' service reads their input files)."""

    @classmethod
    def open(cls, config: BatchesConfig, storage: Storage, owners: Owners | None = None) -> BatchStore:
        """The files and batches of the storage root (the ingress's and the runner's alike), with
        `config`'s caps and the root's `owners` (read from the root when not given); a root written
        before the owners' index is indexed once.
        """
        store = cls(FileStore(storage, owners or stored_owners(storage), config))
        store.files.records.index_existing()
        store.records.index_existing()
        return store

    def __init__(self, files: FileStore) -> None:
        self.files = files
        self.storage = files.storage
        self.records = Records(files.storage, "batches", files.records.owners, "batch")

    def create(self, batch: dict[str, Any], caller: Caller, key: KeyName | None = None) -> dict[str, Any]:
        """Keep a new batch of `caller`'s (OpenAI's batch object, `validating`, made by the route) on its
        input file, which must be the caller's and of purpose `batch`; `key`: its key as the limits name
        it (its lines count against it).
        """
        source = self.files.retrieve(batch["input_file_id"], caller)  # 404 unless the caller's
        if source["purpose"] != "batch":
            raise InvalidRequestError(
                f"The file {source['id']!r} has purpose {source['purpose']!r}; a batch needs purpose 'batch'.",
                param="input_file_id",
            )
        record: dict[str, Any] = {"object": batch, "owner": self.records.owners.tag(caller)}
        if key is not None:
            record["key"] = list(key)
        self.records.save(batch["id"], record)
        logger.info(
            "request %s: batch %s created: validating, %s on %s",
            caller.request_id,
            batch["id"],
            batch["endpoint"],
            source["id"],
        )
        return batch

    def _shown(self, record: dict[str, Any]) -> dict[str, Any]:
        """The batch as its caller sees it: `cancelling` once cancelled, until the runner acts."""
        batch = dict(record["object"])
        if batch["status"] not in TERMINAL and batch["status"] != "cancelling":
            marker = self.storage.read(cancel_marker(batch["id"]))
            if marker is not None:
                batch["status"] = "cancelling"
                batch["cancelling_at"] = json.loads(marker)["at"]
        return batch

    def key(self, batch_id: str) -> KeyName | None:
        """The key a batch's lines count against (None: no limits when it was made)."""
        record = self.records.load(batch_id)
        key = record.get("key") if record else None
        return (str(key[0]), str(key[1])) if isinstance(key, list) and len(key) == 2 else None

    def retrieve(self, batch_id: str, caller: Caller) -> dict[str, Any]:
        return self._shown(self.records.owned(batch_id, caller))

    def list(self, caller: Caller, limit: int, after: str | None) -> dict[str, Any]:
        """The caller's batches, newest first."""
        batches = [self._shown(r) for r in self.records.mine(caller)]
        batches.sort(key=lambda b: (b["created_at"], b["id"]), reverse=True)
        return page(batches, limit, after)

    def cancel(self, batch_id: str, caller: Caller) -> dict[str, Any]:
        batch = self.retrieve(batch_id, caller)
        if batch["status"] in TERMINAL:
            if batch["status"] == "cancelled":
                return batch
            raise InvalidRequestError(f"The batch {batch_id!r} is {batch['status']}: it cannot be cancelled.")
        if batch["status"] != "cancelling":
            self.storage.write(cancel_marker(batch_id), json.dumps({"at": int(time.time())}).encode())
            logger.info("request %s: batch %s: %s -> cancelling", caller.request_id, batch_id, batch["status"])
        return self.retrieve(batch_id, caller)

"""Stored responses (/v1/responses with `store: true`): each response with its input and the
conversation it continued, for `previous_response_id`, `GET`/`DELETE /v1/responses/{id}` and its
input items, kept in the storage root, so that every ingress replica finds what another stored and a
restart, a redeploy or a new cluster on the same root loses none.

A response is one record, `responses/<id>.json`: `{"owner": tag, "stored_at": s, "entry": {...}}`
(`owners`: found only by the API key that stored it; to any other it is an unknown id). Beside it,
a marker on the shelf, `index/responses-shelf/<stored_at ms>_<bytes>_<id>` (empty), names it by age
and by the record's size (so that the record names its marker): the sweep reads names, not records,
to keep the store within `server.state.responses_max_bytes` (the oldest go first) and
`responses_max_age_s`. The marker is written before the record and removed after it, so that a
crash leaves at worst a marker without its record, which the sweep removes. Every replica sweeps, at
most every `SWEEP_INTERVAL_S` or once it has written an eighth of the bytes allowed since its last
sweep; deletions are idempotent, so replicas sweeping at once only repeat each other. Between sweeps
the store may pass its bound by what the replicas wrote meanwhile; a response past its age is never
found, swept or not.

Each call's disk work runs on a worker thread, never on the replica's event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from deployments.state.owners import Caller, Found, Owners
from deployments.state.records import INDEX, RECORD_ID
from deployments.state.storage import Storage

logger = logging.getLogger("ray.serve")

Entry = dict[str, Any]  # {"response": the response object, "input": its items, "conversation": all before it}
Lookup = Found[Entry]

FOLDER = "responses"
SHELF = f"{INDEX}/responses-shelf"
SWEEP_INTERVAL_S = 60.0
SETTLING_S = 10.0  # a marker this young may be a save whose record is still being written: not swept for size


def _marker(stored_at: float, size: int, response_id: str) -> str:
    return f"{SHELF}/{int(stored_at * 1000):015d}_{size}_{response_id}"  # zero-padded: the names sort by age


def _shelved(name: str) -> tuple[float, int, str] | None:
    """A marker's name read back: stored at (s), bytes, id; None for a name that is not one."""
    stored_ms, _, rest = name.partition("_")
    size, _, response_id = rest.partition("_")
    if not (stored_ms.isdigit() and size.isdigit() and RECORD_ID.fullmatch(response_id)):
        return None
    return int(stored_ms) / 1000, int(size), response_id


class StoredResponses:
    """The responses of one storage root, bounded in bytes (`max_bytes`; 0 keeps none) and age
    (`max_age_s`), each its owner's (`owners`: the root's, shared with its files and batches).
    """

    def __init__(
        self,
        storage: Storage,
        owners: Owners,
        max_bytes: int,
        max_age_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.storage = storage
        self._owners = owners
        self._max_bytes = max_bytes
        self._max_age_s = max_age_s
        self._clock = clock
        self._written = 0  # bytes written since this replica's last sweep
        self._swept_at = float("-inf")
        self._sweeping: asyncio.Task[int] | None = None

    @staticmethod
    def _path(response_id: str) -> str:
        return f"{FOLDER}/{response_id}.json"

    async def put(self, response_id: str, entry: Entry, caller: Caller) -> None:
        if self._max_bytes == 0:
            return
        await asyncio.to_thread(self.save, response_id, entry, caller)
        if self._due():
            self._sweeping = asyncio.ensure_future(asyncio.to_thread(self._sweep_or_say))  # the request goes on

    async def get(self, response_id: str, caller: Caller) -> Lookup:
        return await asyncio.to_thread(self.find, response_id, caller)

    async def delete(self, response_id: str, caller: Caller) -> Lookup:
        return await asyncio.to_thread(self.find, response_id, caller, True)

    def save(self, response_id: str, entry: Entry, caller: Caller) -> None:
        """Write the response's record, its marker on the shelf first."""
        if not RECORD_ID.fullmatch(response_id):
            raise ValueError(f"not a response id of this service: {response_id!r}")
        stored_at = self._clock()
        record = {"owner": self._owners.tag(caller), "stored_at": stored_at, "entry": entry}
        data = json.dumps(record, separators=(",", ":")).encode()
        self.storage.write(_marker(stored_at, len(data), response_id), b"")
        self.storage.write(self._path(response_id), data)
        self._written += len(data)

    def find(self, response_id: str, caller: Caller, delete: bool = False) -> Lookup:
        """The caller's stored response (removed when `delete`); not found when unknown, past its age
        (removed then), or another owner's (`foreign`).
        """
        if not RECORD_ID.fullmatch(response_id):
            return Lookup()  # never a path: no id of ours has a slash, a dot or a null byte
        data = self.storage.read(self._path(response_id))
        if data is None:
            return Lookup()
        record = json.loads(data)
        if record["stored_at"] < self._clock() - self._max_age_s:
            self._remove(response_id, record["stored_at"], len(data))
            return Lookup()
        if not self._owners.owns(record.get("owner"), caller):
            return Lookup(foreign=True)
        if delete:
            self._remove(response_id, record["stored_at"], len(data))
        return Lookup(record["entry"])

    def size_of(self, response_id: str, caller: Caller) -> int | None:
        """The bytes of the caller's stored response (its record: the response, its input and the
        conversation it continued); None where `find` finds nothing. Only reads: one past its age is
        left for `find` or the sweep to remove.
        """
        if not RECORD_ID.fullmatch(response_id):
            return None
        data = self.storage.read(self._path(response_id))
        if data is None:
            return None
        record = json.loads(data)
        if record["stored_at"] < self._clock() - self._max_age_s or not self._owners.owns(record.get("owner"), caller):
            return None
        return len(data)

    def _remove(self, response_id: str, stored_at: float, size: int) -> None:
        """The record, then its marker (named by what the record holds)."""
        self.storage.delete(self._path(response_id))
        self.storage.delete(_marker(stored_at, size, response_id))

    def _due(self) -> bool:
        if self._sweeping is not None and not self._sweeping.done():
            return False
        return self._written * 8 >= self._max_bytes or self._clock() - self._swept_at >= SWEEP_INTERVAL_S

    def _sweep_or_say(self) -> int:
        """A sweep in the background: a storage error is logged (the next put tries again), never raised."""
        try:
            return self.sweep()
        except OSError as exc:
            logger.warning("responses store: the sweep failed (%s); the next one tries again", exc)
            return 0

    def sweep(self) -> int:
        """Remove the responses past their age, then the oldest until the rest fit in `max_bytes`
        (any owner's): the number removed.
        """
        self._written, self._swept_at = 0, self._clock()
        shelf = [(name, _shelved(name)) for name in self.storage.names(SHELF)]
        total = sum(found[1] for _, found in shelf if found is not None)
        oldest = self._clock() - self._max_age_s
        removed = 0
        settling = self._clock() - SETTLING_S
        for name, found in shelf:  # oldest first: the names sort by age
            if found is not None and found[0] >= oldest and (total <= self._max_bytes or found[0] > settling):
                break
            if found is not None:
                self.storage.delete(self._path(found[2]))
                total -= found[1]
                removed += 1
            self.storage.delete(f"{SHELF}/{name}")
        if removed:
            logger.info("responses store: %d removed (age or size), %d bytes kept", removed, total)
        return removed

    def size(self) -> tuple[int, int]:
        """The responses kept and their bytes, as the shelf counts them."""
        found = [f for f in map(_shelved, self.storage.names(SHELF)) if f is not None]
        return len(found), sum(f[1] for f in found)

"""The store of /v1/responses (`store: true`): each response with its input and the conversation
it continued, for `previous_response_id`, `GET`/`DELETE /v1/responses/{id}` and its input items.

A WebSocket connection also remembers its last response, stored or not (`ConnectionCache`).

Every ingress replica reaches the same store: one named Ray actor per Serve application
(`ResponseStore.start`, called by each ingress replica as it starts, starts it or finds it,
`get_if_exists`: a new actor is a new worker process, seconds on a busy machine, which the first
requests should not wait for), detached, so that it outlives
any one replica and a redeploy of the application (stored responses survive a rolling update; the
new settings bound it again); it holds no CPU. It stays until Ray stops or it is killed
(`ray.kill`): deleting the application leaves it. It is bounded: at most
`server.responses_max_entries` responses, none older than `server.responses_max_age_s` (the oldest
go first); an evicted or unknown id is `PreviousResponseNotFound` for a continuation,
`ResponseNotFoundError` (404) for a GET.

Each response belongs to the API key that made it (`ingress.owners`): the store keeps its owner's
tag and finds it only for that owner; for another key it is an unknown id (the same 404 or
`previous_response_not_found`), and the refusal is logged with the request's id."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any, Protocol

import ray

from deployments.errors import PreviousResponseNotFound, ResponseNotFoundError
from deployments.state.owners import Caller, Found, Owners, refused

logger = logging.getLogger("ray.serve")

Entry = dict[str, Any]  # {"response": the response object, "input": its items, "conversation": all before it}


Lookup = Found[Entry]


class ResponseStorePort(Protocol):
    """What the Responses endpoint calls: the actor's methods, awaited, each for one caller."""

    async def put(self, response_id: str, entry: Entry, caller: Caller) -> None: ...

    async def get(self, response_id: str, caller: Caller) -> Lookup: ...

    async def delete(self, response_id: str, caller: Caller) -> Lookup: ...


class BoundedResponses:
    """The entries, oldest first, bounded in count and age; the actor's state (and, in process, the
    unit tests' store)."""

    def __init__(self, max_entries: int, max_age_s: float) -> None:
        self._entries: OrderedDict[str, tuple[float, str | None, Entry]] = OrderedDict()  # stored at, owner
        self._owners = Owners()
        self.bound(max_entries, max_age_s)

    def bound(self, max_entries: int, max_age_s: float) -> None:
        """New bounds (a redeployed application's settings, for the actor that outlived the last)."""
        self._max_entries = max_entries
        self._max_age_s = max_age_s
        self._evict()

    def _evict(self) -> None:
        oldest = time.monotonic() - self._max_age_s
        while self._entries and (
            len(self._entries) > self._max_entries or next(iter(self._entries.values()))[0] < oldest
        ):
            self._entries.popitem(last=False)

    async def put(self, response_id: str, entry: Entry, caller: Caller) -> None:
        self._entries[response_id] = (time.monotonic(), self._owners.tag(caller), entry)
        self._evict()

    async def get(self, response_id: str, caller: Caller) -> Lookup:
        self._evict()
        kept = self._entries.get(response_id)
        if kept is None:
            return Lookup()
        if not self._owners.owns(kept[1], caller):
            return Lookup(foreign=True)
        return Lookup(kept[2])

    async def delete(self, response_id: str, caller: Caller) -> Lookup:
        found = await self.get(response_id, caller)
        if found.thing is not None:
            del self._entries[response_id]
        return found


class ResponseStore:
    """The ingress's client of the named store actor of its application (`name`)."""

    def __init__(self, name: str, max_entries: int, max_age_s: float) -> None:
        self._name = name
        self._bounds = (max_entries, max_age_s)
        self._actor: Any = None

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the actor (or find it) and wait, at most `timeout_s`, until it answers: called as
        the ingress replica starts. A store still starting after that is logged; calls then wait for it."""
        try:
            ray.get(self._connect(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            logger.warning("the responses store %r did not answer within %gs; still starting", self._name, timeout_s)

    def _connect(self) -> ray.ObjectRef:
        """Start the actor or find it, and bound it with this deployment's settings (a store found, not
        started, has another deployment's): the bound call's reference, ready once the actor answers."""
        actor = ray.remote(BoundedResponses).options(
            name=self._name, get_if_exists=True, lifetime="detached", num_cpus=0, max_restarts=-1
        )
        self._actor = actor.remote(*self._bounds)
        return self._actor.bound.remote(*self._bounds)

    def _store(self) -> Any:
        if self._actor is None:
            self._connect()
        return self._actor

    async def put(self, response_id: str, entry: Entry, caller: Caller) -> None:
        await self._store().put.remote(response_id, entry, caller)

    async def get(self, response_id: str, caller: Caller) -> Lookup:
        found: Lookup = await self._store().get.remote(response_id, caller)
        return found

    async def delete(self, response_id: str, caller: Caller) -> Lookup:
        found: Lookup = await self._store().delete.remote(response_id, caller)
        return found


async def _lookup(
    store: ResponseStorePort | None, response_id: str, caller: Caller, delete: bool = False
) -> Entry | None:
    """The caller's stored response (deleted from the store when `delete`); None for an unknown id and
    for another owner's, the latter logged."""
    if store is None:
        return None
    found = await (store.delete if delete else store.get)(response_id, caller)
    if found.foreign:
        refused("response", response_id, caller)
    return found.thing


async def earlier_entry(
    store: ResponseStorePort | None, response_id: str, caller: Caller, connection: ConnectionCache | None = None
) -> Entry:
    """The response that a request continues (`previous_response_id`): its WebSocket connection's
    last one, or one that the caller stored."""
    entry = connection.take(response_id) if connection is not None else None
    if entry is None:
        entry = await _lookup(store, response_id, caller)
    if entry is None:
        raise PreviousResponseNotFound(
            f"Previous response with id {response_id!r} not found (unknown, deleted, or evicted from the store; "
            "a store: false response is continued only on its WebSocket connection, by the next turn).",
            param="previous_response_id",
        )
    return entry


def _not_found(response_id: str) -> ResponseNotFoundError:
    return ResponseNotFoundError(f"Response with id {response_id!r} not found.", param="response_id")


async def stored_entry(store: ResponseStorePort | None, response_id: str, caller: Caller) -> Entry:
    """A response that the caller stored, for the GET routes."""
    entry = await _lookup(store, response_id, caller)
    if entry is None:
        raise _not_found(response_id)
    return entry


async def delete_entry(store: ResponseStorePort | None, response_id: str, caller: Caller) -> None:
    """Forget a response that the caller stored (the DELETE route)."""
    if await _lookup(store, response_id, caller, delete=True) is None:
        raise _not_found(response_id)


class ConnectionCache:
    """A WebSocket connection's own memory of its most recent response (OpenAI's connection-local
    cache), `store: false` or not, so that the next turn on the connection continues it; nothing
    outlives the connection. A continuation takes its response out (`take`): when the turn
    succeeds its own response is remembered instead, and when it fails nothing is, so that a failed
    continuation cannot be continued again (a stored response is still found in the store)."""

    def __init__(self) -> None:
        self._last: tuple[str, Entry] | None = None

    def take(self, response_id: str) -> Entry | None:
        if self._last is None or self._last[0] != response_id:
            return None
        entry, self._last = self._last[1], None
        return entry

    def remember(self, response_id: str, entry: Entry) -> None:
        self._last = (response_id, entry)

    def forget(self, response_id: str | None) -> None:
        if self._last is not None and self._last[0] == response_id:
            self._last = None

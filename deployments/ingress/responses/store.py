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
`ResponseNotFoundError` (404) for a GET."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any, Protocol

import ray

from deployments.errors import PreviousResponseNotFound, ResponseNotFoundError

logger = logging.getLogger("ray.serve")

Entry = dict[str, Any]  # {"response": the response object, "input": its items, "conversation": all before it}


class ResponseStorePort(Protocol):
    """What the Responses endpoint calls: the actor's methods, awaited."""

    async def put(self, response_id: str, entry: Entry) -> None: ...

    async def get(self, response_id: str) -> Entry | None: ...

    async def delete(self, response_id: str) -> bool: ...


class BoundedResponses:
    """The entries, oldest first, bounded in count and age; the actor's state (and, in process, the
    unit tests' store)."""

    def __init__(self, max_entries: int, max_age_s: float) -> None:
        self._entries: OrderedDict[str, tuple[float, Entry]] = OrderedDict()
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

    async def put(self, response_id: str, entry: Entry) -> None:
        self._entries[response_id] = (time.monotonic(), entry)
        self._evict()

    async def get(self, response_id: str) -> Entry | None:
        self._evict()
        kept = self._entries.get(response_id)
        return kept[1] if kept else None

    async def delete(self, response_id: str) -> bool:
        self._evict()
        return self._entries.pop(response_id, None) is not None


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

    async def put(self, response_id: str, entry: Entry) -> None:
        await self._store().put.remote(response_id, entry)

    async def get(self, response_id: str) -> Entry | None:
        entry: Entry | None = await self._store().get.remote(response_id)
        return entry

    async def delete(self, response_id: str) -> bool:
        deleted: bool = await self._store().delete.remote(response_id)
        return deleted


async def earlier_entry(
    store: ResponseStorePort | None, response_id: str, connection: ConnectionCache | None = None
) -> Entry:
    """The response that a request continues (`previous_response_id`): its WebSocket connection's
    last one, or a stored one."""
    entry = connection.take(response_id) if connection is not None else None
    if entry is None and store is not None:
        entry = await store.get(response_id)
    if entry is None:
        raise PreviousResponseNotFound(
            f"Previous response with id {response_id!r} not found (unknown, deleted, or evicted from the store; "
            "a store: false response is continued only on its WebSocket connection, by the next turn).",
            param="previous_response_id",
        )
    return entry


def _not_found(response_id: str) -> ResponseNotFoundError:
    return ResponseNotFoundError(f"Response with id {response_id!r} not found.", param="response_id")


async def stored_entry(store: ResponseStorePort | None, response_id: str) -> Entry:
    """A stored response, for the GET routes."""
    entry = await store.get(response_id) if store is not None else None
    if entry is None:
        raise _not_found(response_id)
    return entry


async def delete_entry(store: ResponseStorePort | None, response_id: str) -> None:
    """Forget a stored response (the DELETE route)."""
    if store is None or not await store.delete(response_id):
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

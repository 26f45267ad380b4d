"""How the Responses endpoint reaches its stored responses (`store: true`; kept by
`deployments.state.responses` in the storage root that every ingress replica shares): the port it
calls, the lookups of its routes (an unknown, expired or another key's id is
`PreviousResponseNotFound` for a continuation, `ResponseNotFoundError` (404) for a GET, the other
key's refusal logged with the request's id), and a WebSocket connection's memory of its last
response, stored or not (`ConnectionCache`).
"""

from __future__ import annotations

from typing import Any, Protocol

from deployments.errors import PreviousResponseNotFound, ResponseNotFoundError
from deployments.state.owners import Caller, refused
from deployments.state.responses import Entry, Lookup


class ResponseStorePort(Protocol):
    """What the Responses endpoint calls, each for one caller (`StoredResponses`)."""

    async def put(self, response_id: str, entry: Entry, caller: Caller) -> None: ...

    async def get(self, response_id: str, caller: Caller) -> Lookup: ...

    async def delete(self, response_id: str, caller: Caller) -> Lookup: ...


class ConversationPort(Protocol):
    """What a Responses turn on a conversation calls (`deployments.state.conversations`), on a worker
    thread: its items (after checking there is room for more), then the turn's items added.
    """

    def items(self, conversation_id: str, caller: Caller) -> list[dict[str, Any]]: ...

    def check_room(self, conversation_id: str, caller: Caller) -> None: ...

    def add(
        self, conversation_id: str, items: list[dict[str, Any]], caller: Caller, force: bool = False
    ) -> list[dict[str, Any]]: ...


async def _lookup(
    store: ResponseStorePort | None, response_id: str, caller: Caller, delete: bool = False
) -> Entry | None:
    """The caller's stored response (deleted from the store when `delete`); None for an unknown id and
    for another owner's, the latter logged.
    """
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
    last one, or one that the caller stored.
    """
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
    continuation cannot be continued again (a stored response is still found in the store).
    """

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

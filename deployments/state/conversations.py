"""The Conversations API's logic: conversations kept in the storage root, each owned by the API key
that made it (`records.py`: to any other key it does not exist, the 404 of an unknown id, the refusal
logged), and their items, which a Responses turn reads before its input and adds to after its answer.

A conversation is its object (`conversations/<id>.json`, through `Records`) and its items' log
(`conversation-items/<id>.jsonl`): one JSON record per change, `{"add": [items]}` for items added
together or `{"delete": "<item id>"}`, each written by one `Storage.append` call, so that the turns
of two ingress replicas at once never interleave within a record. Each record starts with its
newline: a record torn by a crash is a line of its own, skipped when the log is read, and the next
record, on a new line, stays whole. Reading replays the log once, oldest first, a deletion found by
its id (never by a pass over the items): a read costs the log's length, however many deletions it
holds, and a list page parses the add records only from its end as far as the page reaches.

The log's bytes are the conversation's size, bounded by `max_bytes`: an add that would pass it is
refused (a 400), unless forced (a Responses turn already answered keeps its items regardless), and a
Responses turn asks `check_room` before it generates. A deletion is a record too: deleted items
still count until the conversation is deleted.

Each key has quotas (`server.state.conversations_max_per_key`, `conversations_max_bytes_per_key`),
counted over its own conversations (its index, `Records`: their number, and their logs' bytes as
stored): creating one past the first, or an add past the second, is refused with OpenAI's 400 (its
storage quota's answer; a Responses turn asks first, as for `max_bytes`), and deleting a conversation
frees both. A replica counts a key's usage from the storage root at most every `USAGE_RECOUNT_S` and
adds its own writes meanwhile: another replica's are seen at the next count.

Its calls block on the storage: the routes and a Responses turn run them in a worker thread, never
on the replica's event loop.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from deployments.config import StateConfig
from deployments.errors import InvalidRequestError, ObjectNotFoundError
from deployments.protocol.openai.items import kept_item, new_item_id
from deployments.state.owners import Caller, Owners, refused
from deployments.state.records import RECORD_ID, Records, page
from deployments.state.storage import Storage

logger = logging.getLogger("ray.serve")

ITEMS = "conversation-items"
USAGE_RECOUNT_S = 10.0  # how stale a replica's count of a key's usage may grow (others' writes)
_DEFAULTS = StateConfig.model_fields


def items_path(conversation_id: str) -> str:
    """The storage path of a conversation's items (one JSON line each)."""
    return f"{ITEMS}/{conversation_id}.jsonl"


def new_conversation_id() -> str:
    """A new conversation id (``conv_`` and 32 hex digits)."""
    return f"conv_{uuid.uuid4().hex}"


@dataclass
class _Usage:
    """A key's conversations and their logs' bytes, as counted at `counted_at` (the store's clock)
    plus this replica's writes since.
    """

    conversations: int
    bytes: int
    counted_at: float


class ConversationStore:
    """The conversations of one storage root: each at most `max_bytes` of items, each key at most
    `max_per_key` conversations and `max_bytes_per_key` bytes of them. Its calls block on the storage:
    the routes run them in a worker thread.
    """

    def __init__(
        self,
        storage: Storage,
        owners: Owners,
        max_bytes: int,
        max_per_key: int = _DEFAULTS["conversations_max_per_key"].default,
        max_bytes_per_key: int = _DEFAULTS["conversations_max_bytes_per_key"].default,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.storage = storage
        self.records = Records(storage, "conversations", owners, "conversation")
        self.max_bytes = max_bytes
        self.max_per_key = max_per_key
        self.max_bytes_per_key = max_bytes_per_key
        self._clock = clock
        self._usage: dict[str | None, _Usage] = {}  # by owner tag; read and changed under `_writing`
        # One writer at a time within this replica: a size checked is the size appended to, and a
        # storage without an append of its own (an object store: read, then rewrite) loses nothing.
        self._writing = threading.Lock()

    def create(self, items: list[dict[str, Any]], metadata: dict[str, str] | None, caller: Caller) -> dict[str, Any]:
        """A new conversation of `caller`'s with `items` (ids given where missing); its object. The
        items are written before the conversation's record: a crash between them leaves nothing seen.
        A 400 past the caller's quotas (`max_per_key`, `max_bytes_per_key`).
        """
        conversation_id = new_conversation_id()
        owner = self.records.owners.tag(caller)
        shown = {"id": conversation_id, "object": "conversation", "created_at": int(time.time())}
        shown["metadata"] = dict(metadata or {})
        with self._writing:
            usage = self._used(owner)
            if usage.conversations >= self.max_per_key:
                raise InvalidRequestError(
                    f"You have exceeded your conversation quota: an API key keeps at most {self.max_per_key} "
                    "conversations. Delete old conversations and try again.",
                    param=None,
                )
            if items:
                self._add(conversation_id, owner, items, force=False, new=True)
            self.records.save(conversation_id, {"object": shown, "owner": owner})
            self._usage[owner].conversations += 1  # `_used` again: a count made meanwhile did not see it
        return shown

    def retrieve(self, conversation_id: str, caller: Caller) -> dict[str, Any]:
        return dict(self._owned(conversation_id, caller)["object"])

    def update(self, conversation_id: str, metadata: dict[str, str] | None, caller: Caller) -> dict[str, Any]:
        """Replace the conversation's metadata (None: none); its object."""
        with self._writing:  # a delete meanwhile is not undone by this save (within this replica)
            record = self._owned(conversation_id, caller)
            shown = {**record["object"], "metadata": dict(metadata or {})}
            self.records.save(conversation_id, {**record, "object": shown})
        return shown

    def delete(self, conversation_id: str, caller: Caller) -> dict[str, Any]:
        """Forget the conversation: its record, then its items (a crash between them leaves a log no
        one reaches); its place and bytes are the key's again.
        """
        self._owned(conversation_id, caller)
        with self._writing:  # not between another write's check and its append (within this replica)
            record = self.records.load(conversation_id)
            if record is not None:  # else deleted meanwhile: counted off once
                size = self.storage.size(items_path(conversation_id)) or 0
                self.records.remove(conversation_id)
                self.storage.delete(items_path(conversation_id))
                usage = self._usage.get(record.get("owner"))
                if usage is not None:
                    usage.conversations = max(0, usage.conversations - 1)
                    usage.bytes = max(0, usage.bytes - size)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    def items(self, conversation_id: str, caller: Caller) -> list[dict[str, Any]]:
        """The conversation's items, oldest first: what a Responses turn puts before its input."""
        self._owned(conversation_id, caller)
        return self._replay(conversation_id)

    def add(
        self, conversation_id: str, items: list[dict[str, Any]], caller: Caller, force: bool = False
    ) -> list[dict[str, Any]]:
        """Add `items` at the conversation's end, each with an id (given where missing) and a
        message's `status`; the items as stored. Refused (a 400) when the conversation would pass
        `max_bytes`, or its key `max_bytes_per_key`, unless `force` (a Responses turn whose answer is
        already given).
        """
        record = self._owned(conversation_id, caller)
        with self._writing:
            return self._add(conversation_id, record.get("owner"), items, force)

    def check_room(self, conversation_id: str, caller: Caller) -> None:
        """A 400 when the conversation is already at `max_bytes`, or its key at `max_bytes_per_key`:
        a Responses turn asks before it generates, since its items are then added whatever their size.
        """
        record = self._owned(conversation_id, caller)
        size = self.storage.size(items_path(conversation_id)) or 0
        if size >= self.max_bytes:
            raise InvalidRequestError(
                f"The conversation {conversation_id!r} is full: it holds {size} bytes of items, at most "
                f"{self.max_bytes}. Start a new conversation.",
                param="conversation",
            )
        with self._writing:
            used = self._used(record.get("owner")).bytes
        if used >= self.max_bytes_per_key:
            raise self._over_quota(used, "conversation")

    def list_items(
        self, conversation_id: str, caller: Caller, limit: int, after: str | None, order: str = "desc"
    ) -> dict[str, Any]:
        """OpenAI's list object of the conversation's items, newest first unless `order` is `asc`: the
        log's add records parsed from that end only as far as the page reaches.
        """
        self._owned(conversation_id, caller)
        log = self._log(conversation_id)
        shown = _past(log.live(order == "desc"), after, limit)
        if shown is None:  # `after` is none of them: the first page, as `page` answers
            shown = _past(log.live(order == "desc"), None, limit) or []
        return page(shown, limit, None)  # `limit + 1` taken: `has_more` says whether one is left

    def item(self, conversation_id: str, item_id: str, caller: Caller) -> dict[str, Any]:
        self._owned(conversation_id, caller)
        for item in self._log(conversation_id).live():
            if item["id"] == item_id:
                return item
        raise _no_item(item_id)

    def delete_item(self, conversation_id: str, item_id: str, caller: Caller) -> dict[str, Any]:
        """Remove an item (a deletion record in the log); the conversation's object, as OpenAI answers."""
        with self._writing:
            record = self._owned(conversation_id, caller)
            if all(item["id"] != item_id for item in self._log(conversation_id).live()):
                raise _no_item(item_id)
            self._append(conversation_id, record.get("owner"), {"delete": item_id}, force=True)
        return dict(record["object"])

    def _owned(self, conversation_id: str, caller: Caller) -> dict[str, Any]:
        """The caller's conversation's record; the same 404 for an unknown id and another key's (logged).
        An id that passes is one of ours (`RECORD_ID`): never a path.
        """
        record = self.records.load(conversation_id)
        if record is not None and not self.records.owners.owns(record.get("owner"), caller):
            refused("conversation", conversation_id, caller)
            record = None
        if record is None:
            raise _no_conversation(conversation_id)
        return record

    def _used(self, owner: str | None) -> _Usage:
        """The key's usage (`owner`: its tag), counted again from its index when older than
        `USAGE_RECOUNT_S`; the caller holds `_writing`.
        """
        usage = self._usage.get(owner)
        now = self._clock()
        if usage is None or now - usage.counted_at >= USAGE_RECOUNT_S:
            ids = [i for i in self.storage.names(self.records._index(owner)) if RECORD_ID.fullmatch(i)]
            size = sum(self.storage.size(items_path(i)) or 0 for i in ids)
            usage = self._usage[owner] = _Usage(len(ids), size, now)
        return usage

    def _over_quota(self, used: int, param: str) -> InvalidRequestError:
        return InvalidRequestError(
            f"You have exceeded your conversation storage quota: an API key keeps at most "
            f"{self.max_bytes_per_key} bytes of conversation items, and this one holds {used}. Delete old "
            "conversations and try again.",
            param=param,
        )

    def _add(
        self, conversation_id: str, owner: str | None, items: list[dict[str, Any]], force: bool, new: bool = False
    ) -> list[dict[str, Any]]:
        """Add `items` as one record of the log (ids given where missing): a 400 for an id the
        conversation (or the items themselves) already holds, unless `force` (a Responses turn: a
        fresh id instead); the items as stored. The caller holds `_writing`.
        """
        if not new and self.records.load(conversation_id) is None:  # deleted since it was found
            raise _no_conversation(conversation_id)
        held = set() if new else {item.get("id") for item in self._replay(conversation_id)}
        stored = _stored(items)
        for item in stored:
            if item["id"] in held:
                if not force:
                    raise InvalidRequestError(
                        f"An item with id {item['id']!r} is already in the conversation: ids are unique.",
                        param="items",
                    )
                item["id"] = new_item_id(item["type"])
            held.add(item["id"])
        self._append(conversation_id, owner, {"add": stored}, force)
        return stored

    def _append(self, conversation_id: str, owner: str | None, change: dict[str, Any], force: bool) -> None:
        """Append one record of the log, in one call (refused past `max_bytes` or the key's
        `max_bytes_per_key` unless `force`), counted to its key (`owner`); the caller holds `_writing`.
        """
        if not RECORD_ID.fullmatch(conversation_id):  # checked by `_owned`, or made here: never a path
            raise ValueError(f"not a conversation id: {conversation_id!r}")
        data = b"\n" + json.dumps(change, separators=(",", ":")).encode()
        path = items_path(conversation_id)
        size = self.storage.size(path) or 0
        if not force and size + len(data) > self.max_bytes:
            raise InvalidRequestError(
                f"The items would take the conversation to {size + len(data)} bytes, past its "
                f"{self.max_bytes}. Add fewer or smaller items, or start a new conversation.",
                param="items",
            )
        usage = self._used(owner)
        if not force and usage.bytes + len(data) > self.max_bytes_per_key:
            raise self._over_quota(usage.bytes, "items")
        self.storage.append(path, data)
        usage.bytes += len(data)

    def _replay(self, conversation_id: str) -> list[dict[str, Any]]:
        """The live items, oldest first."""
        return list(self._log(conversation_id).live())

    def _log(self, conversation_id: str) -> _Log:
        """The conversation's log, read in one pass: its deletions parsed, its add records kept to be
        parsed when walked (a record that cannot be read is skipped: the one a crash tore).
        """
        data = self.storage.read(items_path(conversation_id)) or b""
        log = _Log(conversation_id, [], {})
        for number, line in enumerate(data.split(b"\n")):
            if line.startswith(b'{"add":'):  # as `_append` writes one
                log.adds.append((number, line))
                continue
            if not line.strip():
                continue
            try:
                change = json.loads(line)
            except ValueError:
                _torn(conversation_id, number)
                continue
            if isinstance(change, dict) and isinstance(change.get("delete"), str):
                log.deleted[change["delete"]] = number
            elif isinstance(change, dict) and "add" in change:
                log.adds.append((number, line))
        return log


@dataclass
class _Log:
    """A conversation's log as read: its add records (record number, line), each parsed when
    walked, and each deleted id's last deletion record. An item is live unless a later record
    deletes its id, so a deletion costs a lookup, never a pass over the items (a log written before
    ids were unique may repeat one: a deletion removes every copy before it).
    """

    conversation_id: str
    adds: list[tuple[int, bytes]]
    deleted: dict[str, int]

    def live(self, newest_first: bool = False) -> Iterator[dict[str, Any]]:
        """The live items, oldest first (or newest first), parsing records only as far as it is walked."""
        for number, line in reversed(self.adds) if newest_first else self.adds:
            try:
                change = json.loads(line)
            except ValueError:
                _torn(self.conversation_id, number)
                continue
            added = change.get("add") if isinstance(change, dict) else None
            if not isinstance(added, list):
                continue
            for item in reversed(added) if newest_first else added:
                if self.deleted.get(item.get("id"), -1) < number:
                    yield item


def _past(items: Iterator[dict[str, Any]], after: str | None, limit: int) -> list[dict[str, Any]] | None:
    """Up to `limit + 1` of `items` after the one whose id is `after` (None: from the first); None
    when `after` is none of them.
    """
    taken: list[dict[str, Any]] = []
    found = after is None
    for item in items:
        if not found:
            found = item["id"] == after
            continue
        taken.append(item)
        if len(taken) > limit:
            break
    return taken if found else None


def _torn(conversation_id: str, number: int) -> None:
    logger.warning("conversation %s: record %d of its items is torn; skipped", conversation_id, number)


def _stored(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items as the log keeps them (`kept_item`: an id where one is missing, a message's text
    `content` as one part), a message's `status` `completed` where it has none.
    """
    stored = [kept_item(item) for item in items]
    for item in stored:
        if item["type"] == "message" and not item.get("status"):
            item["status"] = "completed"
    return stored


def _no_conversation(conversation_id: str) -> ObjectNotFoundError:
    return ObjectNotFoundError(f"Conversation with id {conversation_id!r} not found.", param="conversation_id")


def _no_item(item_id: str) -> ObjectNotFoundError:
    return ObjectNotFoundError(f"Item with id {item_id!r} not found.", param="item_id")

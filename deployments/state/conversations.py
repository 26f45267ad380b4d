"""The Conversations API's logic: conversations kept in the storage root, each owned by the API key
that made it (`records.py`: to any other key it does not exist, the 404 of an unknown id, the refusal
logged), and their items, which a Responses turn reads before its input and adds to after its answer.

A conversation is its object (`conversations/<id>.json`, through `Records`) and its items' log
(`conversation-items/<id>.jsonl`): one JSON record per change, `{"add": [items]}` for items added
together or `{"delete": "<item id>"}`, each written by one `Storage.append` call, so that the turns
of two ingress replicas at once never interleave within a record. Each record starts with its
newline: a record torn by a crash is a line of its own, skipped when the log is read, and the next
record, on a new line, stays whole. Reading replays the log, oldest first.

The log's bytes are the conversation's size, bounded by `max_bytes`: an add that would pass it is
refused (a 400), unless forced (a Responses turn already answered keeps its items regardless), and a
Responses turn asks `check_room` before it generates. A deletion is a record too: deleted items
still count until the conversation is deleted."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from typing import Any

from deployments.errors import InvalidRequestError, ObjectNotFoundError
from deployments.protocol.openai.items import kept_item, new_item_id
from deployments.state.owners import Caller, Owners, refused
from deployments.state.records import RECORD_ID, Records, page
from deployments.state.storage import Storage

logger = logging.getLogger("ray.serve")

ITEMS = "conversation-items"


def items_path(conversation_id: str) -> str:
    return f"{ITEMS}/{conversation_id}.jsonl"


def new_conversation_id() -> str:
    return f"conv_{uuid.uuid4().hex}"


class ConversationStore:
    """The conversations of one storage root. Its calls block on the storage: the routes run them
    in a worker thread."""

    def __init__(self, storage: Storage, owners: Owners, max_bytes: int) -> None:
        self.storage = storage
        self.records = Records(storage, "conversations", owners, "conversation")
        self.max_bytes = max_bytes
        # One writer at a time within this replica: a size checked is the size appended to, and a
        # storage without an append of its own (an object store: read, then rewrite) loses nothing.
        self._writing = threading.Lock()

    def create(self, items: list[dict[str, Any]], metadata: dict[str, str] | None, caller: Caller) -> dict[str, Any]:
        """A new conversation of `caller`'s with `items` (ids given where missing); its object. The
        items are written before the conversation's record: a crash between them leaves nothing seen."""
        conversation_id = new_conversation_id()
        if items:
            self._add(conversation_id, items, force=False, new=True)
        shown = {"id": conversation_id, "object": "conversation", "created_at": int(time.time())}
        shown["metadata"] = dict(metadata or {})
        self.records.save(conversation_id, {"object": shown, "owner": self.records.owners.tag(caller)})
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
        one reaches)."""
        self._owned(conversation_id, caller)
        with self._writing:  # not between another write's check and its append (within this replica)
            self.records.remove(conversation_id)
            self.storage.delete(items_path(conversation_id))
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
        `max_bytes`, unless `force` (a Responses turn whose answer is already given)."""
        self._owned(conversation_id, caller)
        return self._add(conversation_id, items, force)

    def check_room(self, conversation_id: str, caller: Caller) -> None:
        """A 400 when the conversation is already at `max_bytes`: a Responses turn asks before it
        generates, since its items are then added whatever their size."""
        self._owned(conversation_id, caller)
        size = self.storage.size(items_path(conversation_id)) or 0
        if size >= self.max_bytes:
            raise InvalidRequestError(
                f"The conversation {conversation_id!r} is full: it holds {size} bytes of items, at most "
                f"{self.max_bytes}. Start a new conversation.",
                param="conversation",
            )

    def list_items(
        self, conversation_id: str, caller: Caller, limit: int, after: str | None, order: str = "desc"
    ) -> dict[str, Any]:
        """OpenAI's list object of the conversation's items, newest first unless `order` is `asc`."""
        items = self.items(conversation_id, caller)
        if order == "desc":
            items.reverse()
        return page(items, limit, after)

    def item(self, conversation_id: str, item_id: str, caller: Caller) -> dict[str, Any]:
        self._owned(conversation_id, caller)
        for item in self._replay(conversation_id):
            if item["id"] == item_id:
                return item
        raise _no_item(item_id)

    def delete_item(self, conversation_id: str, item_id: str, caller: Caller) -> dict[str, Any]:
        """Remove an item (a deletion record in the log); the conversation's object, as OpenAI answers."""
        with self._writing:
            record = self._owned(conversation_id, caller)
            if all(item["id"] != item_id for item in self._replay(conversation_id)):
                raise _no_item(item_id)
            self._append(conversation_id, {"delete": item_id}, force=True)
        return dict(record["object"])

    def _owned(self, conversation_id: str, caller: Caller) -> dict[str, Any]:
        """The caller's conversation's record; the same 404 for an unknown id and another key's (logged).
        An id that passes is one of ours (`RECORD_ID`): never a path."""
        record = self.records.load(conversation_id)
        if record is not None and not self.records.owners.owns(record.get("owner"), caller):
            refused("conversation", conversation_id, caller)
            record = None
        if record is None:
            raise _no_conversation(conversation_id)
        return record

    def _add(self, conversation_id: str, items: list[dict[str, Any]], force: bool, new: bool = False) -> list[dict]:
        """Add `items` as one record of the log (ids given where missing): a 400 for an id the
        conversation (or the items themselves) already holds, unless `force` (a Responses turn: a
        fresh id instead); the items as stored."""
        with self._writing:
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
            self._append(conversation_id, {"add": stored}, force)
        return stored

    def _append(self, conversation_id: str, change: dict[str, Any], force: bool) -> None:
        """Append one record of the log, in one call (refused past `max_bytes` unless `force`); the
        caller holds `_writing`."""
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
        self.storage.append(path, data)

    def _replay(self, conversation_id: str) -> list[dict[str, Any]]:
        """The live items, oldest first, from the log (a record that cannot be read is skipped: the
        one a crash tore)."""
        data = self.storage.read(items_path(conversation_id)) or b""
        items: list[dict[str, Any]] = []
        for number, line in enumerate(data.split(b"\n")):
            if not line.strip():
                continue
            try:
                change = json.loads(line)
            except ValueError:
                logger.warning("conversation %s: record %d of its items is torn; skipped", conversation_id, number)
                continue
            if isinstance(change, dict) and isinstance(change.get("add"), list):
                items.extend(change["add"])
            elif isinstance(change, dict) and "delete" in change:
                items = [item for item in items if item.get("id") != change["delete"]]
        return items


def _stored(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items as the log keeps them (`kept_item`: an id where one is missing, a message's text
    `content` as one part), a message's `status` `completed` where it has none."""
    stored = [kept_item(item) for item in items]
    for item in stored:
        if item["type"] == "message" and not item.get("status"):
            item["status"] = "completed"
    return stored


def _no_conversation(conversation_id: str) -> ObjectNotFoundError:
    return ObjectNotFoundError(f"Conversation with id {conversation_id!r} not found.", param="conversation_id")


def _no_item(item_id: str) -> ObjectNotFoundError:
    return ObjectNotFoundError(f"Item with id {item_id!r} not found.", param="item_id")

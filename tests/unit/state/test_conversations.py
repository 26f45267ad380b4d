"""The conversations' store on a local storage root: items kept in order with their ids, their list
pages, deletions, the key rule (another key's conversation is an unknown one, logged), the size cap
and a Responses turn's forced add, a log torn by a crash, and adds at once that lose nothing; a
replay whose work grows with the log, not its items times its deletions (issue 67); each key's
quotas, counted over its own conversations, freed by a delete, and seen by another replica."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import re
import sys
from typing import Any

import pytest

from deployments.errors import InvalidRequestError, ObjectNotFoundError
from deployments.state.conversations import USAGE_RECOUNT_S, ConversationStore, items_path
from deployments.state.owners import Caller
from deployments.state.records import stored_owners
from deployments.state.storage import LocalStorage

ALICE, BOB = Caller(b"a" * 32, "req-alice"), Caller(b"b" * 32, "req-bob")


def store(tmp_path: Any, max_bytes: int = 1_000_000, **quotas: Any) -> ConversationStore:
    storage = LocalStorage(str(tmp_path))
    return ConversationStore(storage, stored_owners(storage), max_bytes, **quotas)


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def texts(items: list[dict[str, Any]]) -> list[str]:
    """Each message's text (kept as one part), or another item's type."""
    return [item["content"][0]["text"] if "content" in item else item["type"] for item in items]


def test_a_conversation_keeps_its_items_in_order_with_ids(tmp_path):
    conversations = store(tmp_path)
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    created = conversations.create([user("one"), call, {"role": "user", "content": "two"}], {"k": "v"}, ALICE)
    assert re.fullmatch(r"conv_[0-9a-f]{32}", created["id"])
    assert created["object"] == "conversation" and created["metadata"] == {"k": "v"}
    assert isinstance(created["created_at"], int)
    assert conversations.retrieve(created["id"], ALICE) == created

    items = conversations.items(created["id"], ALICE)
    assert [item["type"] for item in items] == ["message", "function_call", "message"]
    assert re.fullmatch(r"msg_[0-9a-f]{32}", items[0]["id"]) and re.fullmatch(r"fc_[0-9a-f]{32}", items[1]["id"])
    assert items[0]["status"] == "completed" and "status" not in items[1]  # a message's status only
    assert len({item["id"] for item in items}) == 3

    added = conversations.add(created["id"], [user("three"), {**user("four"), "id": "msg_mine"}], ALICE)
    assert added[1]["id"] == "msg_mine"  # a given id is kept
    assert texts(conversations.items(created["id"], ALICE))[-2:] == ["three", "four"]
    assert conversations.item(created["id"], "msg_mine", ALICE)["content"] == [{"type": "input_text", "text": "four"}]


def test_items_are_listed_in_pages_newest_first_or_oldest_first(tmp_path):
    conversations = store(tmp_path)
    conversation = conversations.create([user(str(n)) for n in range(5)], None, ALICE)["id"]
    newest = conversations.list_items(conversation, ALICE, limit=2, after=None)
    assert newest["object"] == "list" and texts(newest["data"]) == ["4", "3"] and newest["has_more"]
    assert newest["first_id"] == newest["data"][0]["id"] and newest["last_id"] == newest["data"][1]["id"]
    rest = conversations.list_items(conversation, ALICE, limit=10, after=newest["last_id"])
    assert texts(rest["data"]) == ["2", "1", "0"] and not rest["has_more"]
    oldest = conversations.list_items(conversation, ALICE, limit=3, after=None, order="asc")
    assert texts(oldest["data"]) == ["0", "1", "2"] and oldest["has_more"]
    last = conversations.list_items(conversation, ALICE, limit=3, after=oldest["last_id"], order="asc")
    assert texts(last["data"]) == ["3", "4"] and not last["has_more"]
    empty = conversations.list_items(conversations.create([], None, ALICE)["id"], ALICE, 20, None)
    assert empty["data"] == [] and empty["first_id"] is None and not empty["has_more"]


def test_an_item_or_the_conversation_deleted_is_gone(tmp_path):
    conversations = store(tmp_path)
    created = conversations.create([user("keep"), user("drop")], None, ALICE)
    drop = conversations.items(created["id"], ALICE)[1]["id"]
    assert conversations.delete_item(created["id"], drop, ALICE) == created  # the conversation, as OpenAI
    assert texts(conversations.items(created["id"], ALICE)) == ["keep"]
    for missing in (
        lambda: conversations.item(created["id"], drop, ALICE),
        lambda: conversations.delete_item(created["id"], drop, ALICE),
    ):
        with pytest.raises(ObjectNotFoundError, match=drop) as found:
            missing()
        assert found.value.status == 404 and found.value.param == "item_id"

    assert conversations.update(created["id"], {"topic": "x"}, ALICE)["metadata"] == {"topic": "x"}
    assert conversations.retrieve(created["id"], ALICE)["metadata"] == {"topic": "x"}
    assert conversations.update(created["id"], None, ALICE)["metadata"] == {}

    deleted = conversations.delete(created["id"], ALICE)
    assert deleted == {"id": created["id"], "object": "conversation.deleted", "deleted": True}
    assert conversations.storage.size(items_path(created["id"])) is None  # its items are gone with it
    with pytest.raises(ObjectNotFoundError):
        conversations.retrieve(created["id"], ALICE)


def test_another_keys_conversation_is_an_unknown_one_and_the_refusal_is_logged(tmp_path, caplog):
    conversations = store(tmp_path)
    created = conversations.create([user("secret")], None, ALICE)
    item = conversations.items(created["id"], ALICE)[0]["id"]
    calls = {
        "retrieve": lambda cid: conversations.retrieve(cid, BOB),
        "update": lambda cid: conversations.update(cid, {"k": "v"}, BOB),
        "items": lambda cid: conversations.items(cid, BOB),
        "add": lambda cid: conversations.add(cid, [user("intruder")], BOB, force=True),
        "check_room": lambda cid: conversations.check_room(cid, BOB),
        "list_items": lambda cid: conversations.list_items(cid, BOB, 20, None),
        "item": lambda cid: conversations.item(cid, item, BOB),
        "delete_item": lambda cid: conversations.delete_item(cid, item, BOB),
        "delete": lambda cid: conversations.delete(cid, BOB),
    }
    for name, call in calls.items():
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ray.serve"), pytest.raises(ObjectNotFoundError) as foreign:
            call(created["id"])
        with pytest.raises(ObjectNotFoundError) as unknown:
            call("conv_" + "0" * 32)
        assert (str(foreign.value), foreign.value.param) == (
            str(unknown.value).replace("0" * 32, created["id"][5:]),
            "conversation_id",
        ), name
        assert "req-bob" in caplog.text and "another API key" in caplog.text, name
    assert texts(conversations.items(created["id"], ALICE)) == ["secret"]  # untouched
    assert conversations.retrieve(created["id"], ALICE)["metadata"] == {}


@pytest.mark.parametrize("conversation_id", ["../owners.secret", "conv_a/b", "", ".", "conv_\0"])
def test_an_id_that_is_not_ours_is_never_a_path(tmp_path, conversation_id):
    with pytest.raises(ObjectNotFoundError):
        store(tmp_path).items(conversation_id, ALICE)


def test_a_full_conversation_refuses_items_unless_a_turn_forces_them(tmp_path):
    conversations = store(tmp_path, max_bytes=600)
    with pytest.raises(InvalidRequestError, match="600"):
        conversations.create([user("x" * 700)], None, ALICE)
    assert conversations.records.mine(ALICE) == []  # nothing kept
    conversation = conversations.create([user("x" * 300)], None, ALICE)["id"]
    conversations.check_room(conversation, ALICE)  # room left
    with pytest.raises(InvalidRequestError) as full:
        conversations.add(conversation, [user("y" * 300)], ALICE)
    assert full.value.status == 400 and full.value.param == "items"
    assert texts(conversations.items(conversation, ALICE)) == ["x" * 300]
    conversations.add(conversation, [user("y" * 300)], ALICE, force=True)  # a turn already answered
    assert texts(conversations.items(conversation, ALICE)) == ["x" * 300, "y" * 300]
    with pytest.raises(InvalidRequestError, match="full") as no_room:
        conversations.check_room(conversation, ALICE)
    assert no_room.value.param == "conversation"


def test_a_record_torn_by_a_crash_is_skipped_and_the_next_one_is_whole(tmp_path, caplog):
    conversations = store(tmp_path)
    conversation = conversations.create([user("before")], None, ALICE)["id"]
    record = b"\n" + json.dumps({"add": [{**user("torn"), "id": "msg_t"}]}).encode()
    conversations.storage.append(items_path(conversation), record[: len(record) // 2])  # the crash
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        assert texts(conversations.items(conversation, ALICE)) == ["before"]
    assert "torn" in caplog.text
    conversations.add(conversation, [user("after")], ALICE)
    assert texts(conversations.items(conversation, ALICE)) == ["before", "after"]


def test_adds_at_once_lose_nothing(tmp_path):
    conversations = store(tmp_path)
    conversation = conversations.create([], None, ALICE)["id"]
    # A second store on the same root: another ingress replica, with a lock of its own.
    other = store(tmp_path)

    def add(n: int) -> None:
        (conversations if n % 2 else other).add(conversation, [user(f"{n}-a"), user(f"{n}-b")], ALICE)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(add, range(64)))
    items = texts(conversations.items(conversation, ALICE))
    assert sorted(items) == sorted(f"{n}-{part}" for n in range(64) for part in "ab")
    assert all(items[items.index(f"{n}-a") + 1] == f"{n}-b" for n in range(64))  # an add stays together


def test_an_item_id_is_never_held_twice(tmp_path):
    """A repeated id would make a list page's `after` point at its first copy (the openai client's
    pager then asks for the same page forever): refused on an add, renamed on a Responses turn's."""
    conversations = store(tmp_path)
    mine = {**user("one"), "id": "msg_mine"}
    with pytest.raises(InvalidRequestError) as twice:
        conversations.create([mine, mine], None, ALICE)
    assert twice.value.param == "items"
    conversation = conversations.create([mine], None, ALICE)["id"]
    with pytest.raises(InvalidRequestError):
        conversations.add(conversation, [{**user("again"), "id": "msg_mine"}], ALICE)
    turn = conversations.add(conversation, [{**user("turn"), "id": "msg_mine"}], ALICE, force=True)
    assert turn[0]["id"] != "msg_mine" and turn[0]["id"].startswith("msg_")
    ids = [item["id"] for item in conversations.items(conversation, ALICE)]
    assert len(ids) == len(set(ids)) == 2
    pages, after = [], None
    while True:
        page = conversations.list_items(conversation, ALICE, limit=1, after=after, order="asc")
        pages += [item["id"] for item in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert pages == ids


def test_a_write_after_the_conversation_is_deleted_brings_nothing_back(tmp_path):
    conversations = store(tmp_path)
    conversation = conversations.create([user("one")], {"k": "v"}, ALICE)["id"]
    owned = conversations._owned(conversation, ALICE)  # found, as a write finds it before it writes
    conversations.delete(conversation, ALICE)
    with pytest.raises(ObjectNotFoundError):
        conversations._add(conversation, None, [user("late")], force=True)
    assert conversations.storage.size(items_path(conversation)) is None and owned is not None
    with pytest.raises(ObjectNotFoundError):
        conversations.update(conversation, {"k": "w"}, ALICE)
    assert conversations.records.load(conversation) is None


def replay_calls(tmp_path: Any, items: int) -> int:
    """The function calls (Python's and C's) one read of a conversation makes, its log `items` items
    added 20 at a time, then every one of them deleted, a record each (as the API writes them)."""
    conversations = store(tmp_path / str(items), max_bytes=1 << 30)
    conversation = conversations.create([], None, ALICE)["id"]
    owner = conversations.records.owners.tag(ALICE)
    for start in range(0, items, 20):
        added = [{**user(str(n)), "id": f"msg_{n}"} for n in range(start, start + 20)]
        conversations._append(conversation, owner, {"add": added}, force=True)
    for n in range(items):
        conversations._append(conversation, owner, {"delete": f"msg_{n}"}, force=True)
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        calls += event in ("call", "c_call")

    sys.setprofile(count)
    try:
        left = conversations.items(conversation, ALICE)
    finally:
        sys.setprofile(None)
    assert left == []
    return calls


def test_a_read_costs_the_logs_length_not_its_items_times_its_deletions(tmp_path):
    """20,000 items and 20,000 deletions took 32 s a list (a pass over the items per deletion): the
    work of a log 4 times as long is about 4 times as much (16 times, before)."""
    small, large = replay_calls(tmp_path, 200), replay_calls(tmp_path, 800)
    assert large < 5 * small, (small, large)


def test_a_keys_conversations_are_capped_in_number_and_a_delete_frees_its_place(tmp_path):
    conversations = store(tmp_path, max_per_key=2)
    first = conversations.create([user("one")], None, ALICE)["id"]
    conversations.create([], None, ALICE)
    with pytest.raises(InvalidRequestError, match="conversation quota") as refused:
        conversations.create([user("three")], None, ALICE)
    assert refused.value.status == 400 and refused.value.type == "invalid_request_error"
    assert len(conversations.records.mine(ALICE)) == 2  # nothing kept of the refused one
    assert len(conversations.storage.names("conversation-items")) == 1  # nor its items
    conversations.create([], None, BOB)  # counted over each key's own
    conversations.create([], None, BOB)
    conversations.delete(first, ALICE)
    conversations.create([user("three")], None, ALICE)  # its place freed
    with pytest.raises(InvalidRequestError, match="conversation quota"):
        conversations.create([], None, ALICE)


def test_a_keys_items_are_capped_in_bytes_as_stored_and_a_delete_frees_them(tmp_path):
    conversations = store(tmp_path, max_bytes=10_000, max_bytes_per_key=1_000)
    first = conversations.create([user("x" * 300)], None, ALICE)["id"]
    size = conversations.storage.size(items_path(first))
    assert size is not None and 300 < size < 500  # the log's bytes as stored
    with pytest.raises(InvalidRequestError, match="storage quota") as refused:
        conversations.create([user("y" * 600)], None, ALICE)  # within its conversation's cap, past the key's
    assert refused.value.status == 400 and refused.value.param == "items"
    assert len(conversations.records.mine(ALICE)) == 1
    second = conversations.create([user("y" * 300)], None, ALICE)["id"]
    with pytest.raises(InvalidRequestError, match="storage quota") as added:
        conversations.add(first, [user("z" * 300)], ALICE)
    assert added.value.param == "items" and texts(conversations.items(first, ALICE)) == ["x" * 300]
    conversations.check_room(first, ALICE)  # room left: a turn may start
    conversations.add(second, [user("z" * 300)], ALICE, force=True)  # a turn already answered is kept whole
    for conversation in (first, second):  # the key is past its quota: no turn starts on any of its conversations
        with pytest.raises(InvalidRequestError, match="storage quota") as no_room:
            conversations.check_room(conversation, ALICE)
        assert no_room.value.param == "conversation"
    bobs = conversations.create([user("b" * 600)], None, BOB)["id"]  # another key's bytes are its own
    conversations.check_room(bobs, BOB)
    conversations.delete(second, ALICE)  # its bytes freed
    conversations.check_room(first, ALICE)
    conversations.add(first, [user("z" * 300)], ALICE)


def test_another_replica_counts_a_keys_usage_from_the_root_and_sees_a_delete_at_its_next_count(tmp_path):
    now = [0.0]
    one = store(tmp_path, max_per_key=2, clock=lambda: now[0])
    first = one.create([], None, ALICE)["id"]
    one.create([], None, ALICE)
    other = store(tmp_path, max_per_key=2, clock=lambda: now[0])  # another replica, or this one restarted
    with pytest.raises(InvalidRequestError, match="conversation quota"):
        other.create([], None, ALICE)
    one.delete(first, ALICE)
    now[0] += USAGE_RECOUNT_S  # the other replica's count is due again
    other.create([], None, ALICE)
    now[0] += USAGE_RECOUNT_S
    with pytest.raises(InvalidRequestError, match="conversation quota"):
        one.create([], None, ALICE)  # the other's create counted
    assert len(one.records.mine(ALICE)) == 2


def test_pages_skip_deleted_items_in_either_order_and_the_newest_page_parses_only_its_records(tmp_path):
    conversations = store(tmp_path)
    conversation = conversations.create([], None, ALICE)["id"]
    for start in range(0, 100, 10):
        conversations.add(conversation, [{**user(str(n)), "id": f"msg_{n}"} for n in range(start, start + 10)], ALICE)
    for n in range(0, 100, 3):
        conversations.delete_item(conversation, f"msg_{n}", ALICE)
    conversations.add(conversation, [{**user("again"), "id": "msg_0"}], ALICE)  # an id deleted, then added again
    live = texts(conversations.items(conversation, ALICE))
    assert live == [str(n) for n in range(100) if n % 3] + ["again"]
    for order, expected in (("asc", live), ("desc", live[::-1])):
        pages, after = [], None
        while True:
            listed = conversations.list_items(conversation, ALICE, limit=7, after=after, order=order)
            pages += texts(listed["data"])
            if not listed["has_more"]:
                break
            after = listed["last_id"]
        assert pages == expected, order
    assert texts(conversations.list_items(conversation, ALICE, 3, "msg_unknown")["data"]) == ["again", "98", "97"]

    parsed = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal parsed
        parsed += event == "call" and frame.f_code.co_name == "loads"

    sys.setprofile(count)
    try:
        newest = conversations.list_items(conversation, ALICE, limit=5, after=None)
    finally:
        sys.setprofile(None)
    assert texts(newest["data"]) == ["again", "98", "97", "95", "94"]
    assert parsed == 1 + 34 + 2  # its record, each deletion, and the two add records the page reaches (of 11)

"""What the router keys (`routing.keys`) and what a replica reports it holds (`routing.held`)."""

from __future__ import annotations

from deployments.protocol.replica import GenerateRequest, ImageBytes, MessageImage, MessageText, TextMessage
from deployments.routing.held import HeldPrefixes
from deployments.routing.index import PrefixIndex
from deployments.routing.keys import BLOCK_CHARS, prefix_blocks

SYSTEM = TextMessage(role="system", content="You review pull requests. " * 100)


def chat(*texts: str, **fields: object) -> GenerateRequest:
    return GenerateRequest(messages=[SYSTEM, *(TextMessage(role="user", content=t) for t in texts)], **fields)


def test_a_longer_chat_extends_the_blocks_of_its_beginning():
    first, second = prefix_blocks(chat("one")), prefix_blocks(chat("one", "two " * 200))
    assert len(first) >= 2500 // BLOCK_CHARS - 1
    assert second[: len(first)] == first and len(second) > len(first)


def test_the_adapter_and_the_tools_are_part_of_the_key():
    base = prefix_blocks(chat("one"))
    assert prefix_blocks(chat("one"), "sql")[0] != base[0]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert prefix_blocks(chat("one", tools=tools))[0] != base[0]


def test_native_images_are_keyed_by_their_hash_in_place():
    def with_image(sha: str) -> GenerateRequest:
        parts = [MessageText(text="look " * 100), MessageImage(index=0), MessageText(text=" and tell " * 60)]
        message = TextMessage(role="user", content="", parts=parts)
        return GenerateRequest(messages=[message], images=[ImageBytes(data=b"x", sha256=sha)])

    same, other = prefix_blocks(with_image("aa" * 32)), prefix_blocks(with_image("bb" * 32))
    assert same == prefix_blocks(with_image("aa" * 32))
    assert same[0] == other[0] and same[-1] != other[-1]  # the text before it matches, what follows does not


def test_a_short_prompt_has_no_blocks():
    assert prefix_blocks(GenerateRequest(prompt="hi")) == ()


def test_the_index_is_bounded_and_forgets_least_recently_used_blocks():
    index = PrefixIndex(capacity=len(prefix_blocks(chat("new " * 300))))
    old, new = prefix_blocks(chat("old " * 300)), prefix_blocks(chat("new " * 300))
    index.insert(old, "a", 1.0)
    index.insert(new, "b", 2.0)
    assert len(index) == index.capacity
    assert index.match(new, ["a", "b"])["b"] == len(new)
    assert index.match(old, ["a", "b"])["a"] < len(old)


def test_held_prefixes_keep_a_prompt_per_slot_and_the_next_turn_replaces_its_last():
    held = HeldPrefixes(slots=2)
    one, one_more = prefix_blocks(chat("one")), prefix_blocks(chat("one", "and more " * 50))
    held.served(one)
    held.served(one_more)
    assert held.report()["prompts"] == 1  # the session's second turn replaced its first
    held.served(prefix_blocks(chat("two " * 200)))
    held.served(prefix_blocks(chat("three " * 200)))
    report = held.report()
    assert report["prompts"] == 2 and one_more[-1] not in report["blocks"]


def test_held_prefixes_keep_more_while_the_host_cache_holds_them():
    held = HeldPrefixes(slots=1, host_bytes=10_000, bytes_per_token=10)
    for name in ("a", "b", "c"):
        held.served(prefix_blocks(chat(name * 300)), tokens=400)  # 4,000 bytes each
    assert held.report()["prompts"] == 3  # one in its slot, two in 8,000 bytes of host cache
    held.served(prefix_blocks(chat("d" * 300)), tokens=400)
    assert held.report()["prompts"] == 3

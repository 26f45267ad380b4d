"""The caption cache: bounds, LRU order, hit and miss counts, shared in-flight captions; and the one
generic cache (`media.cache.SharedCache`) under it and the document cache, each with its policy for
work that nobody waits for any more."""

import asyncio

import pytest

from deployments.ingress.documents.cache import DocumentCache
from deployments.ingress.documents.reader import Page, ReadDocument
from deployments.ingress.media.cache import SharedCache
from deployments.ingress.vision.cache import CaptionCache, cache_key, image_digest


class Captioner:
    """Counts calls and the keys it was asked for; optionally slow or failing."""

    def __init__(self, keys: list[str], delay: float = 0.0, error: Exception | None = None) -> None:
        self.keys, self.delay, self.error = keys, delay, error
        self.calls: list[list[str]] = []

    async def __call__(self, indices: list[int]) -> list[str]:
        self.calls.append([self.keys[i] for i in indices])
        await asyncio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        return [f"caption of {self.keys[i]}" for i in indices]


def test_key_depends_on_image_captioner_and_prompt():
    a, b = image_digest(b"image a"), image_digest(b"image b")
    keys = {cache_key(a, "vlm", "p"), cache_key(b, "vlm", "p"), cache_key(a, "vlm2", "p"), cache_key(a, "vlm", "q")}
    assert len(keys) == 4
    assert cache_key(a, "vlm", "p") == cache_key(image_digest(b"image a"), "vlm", "p")


async def test_repeated_images_are_captioned_once_and_counted():
    cache = CaptionCache(max_entries=10, max_bytes=1 << 20)
    keys = ["k1", "k2", "k1"]
    captioner = Captioner(keys)
    assert await cache.get_or_compute(keys, captioner) == ["caption of k1", "caption of k2", "caption of k1"]
    assert captioner.calls == [["k1", "k2"]]  # the duplicate inside one request is not sent twice
    assert await cache.get_or_compute(["k2", "k1"], Captioner(["k2", "k1"])) == ["caption of k2", "caption of k1"]
    assert cache.describe()["hits"] == 3 and cache.describe()["misses"] == 2


async def test_concurrent_requests_share_one_caption_in_flight():
    cache = CaptionCache(max_entries=10, max_bytes=1 << 20)
    first, second = Captioner(["k"], delay=0.05), Captioner(["k"])
    results = await asyncio.gather(cache.get_or_compute(["k"], first), cache.get_or_compute(["k"], second))
    assert results == [["caption of k"], ["caption of k"]]
    assert len(first.calls) + len(second.calls) == 1


async def test_failures_reach_every_waiter_and_are_not_cached():
    cache = CaptionCache(max_entries=10, max_bytes=1 << 20)
    failing = Captioner(["k"], delay=0.02, error=RuntimeError("captioner down"))
    results = await asyncio.gather(
        cache.get_or_compute(["k"], failing), cache.get_or_compute(["k"], failing), return_exceptions=True
    )
    assert all(isinstance(r, RuntimeError) for r in results) and len(failing.calls) == 1
    assert await cache.get_or_compute(["k"], Captioner(["k"])) == ["caption of k"]


async def test_a_caller_that_goes_away_does_not_cancel_the_shared_caption():
    cache = CaptionCache(max_entries=10, max_bytes=1 << 20)
    slow = Captioner(["k"], delay=0.1)
    owner = asyncio.ensure_future(cache.get_or_compute(["k"], slow))
    await asyncio.sleep(0.01)
    waiter = asyncio.ensure_future(cache.get_or_compute(["k"], Captioner(["k"])))
    owner.cancel()
    assert await waiter == ["caption of k"]
    assert cache.get("k") == "caption of k"


@pytest.mark.parametrize(("entries", "mb"), [(5, 1.0), (10_000, 0.01)])
async def test_cache_never_grows_past_its_bounds(entries, mb):
    max_bytes = int(mb * 2**20)
    cache = CaptionCache(max_entries=entries, max_bytes=max_bytes)
    for i in range(2000):
        keys = [f"key-{i}"]
        await cache.get_or_compute(keys, Captioner(keys))
        assert len(cache) <= entries and cache.bytes <= max_bytes
    assert len(cache) > 0
    assert cache.get("key-1999") is not None and cache.get("key-0") is None  # oldest evicted first


def test_recently_used_entries_survive_eviction():
    cache = CaptionCache(max_entries=2, max_bytes=1 << 20)
    cache.put("a", "A")
    cache.put("b", "B")
    assert cache.get("a") == "A"  # a is now the most recent
    cache.put("c", "C")
    assert cache.get("b") is None and cache.get("a") == "A" and cache.get("c") == "C"


async def test_zero_entries_disables_caching():
    cache = CaptionCache(max_entries=0, max_bytes=1 << 20)
    captioner = Captioner(["k"])
    await cache.get_or_compute(["k"], captioner)
    await cache.get_or_compute(["k"], captioner)
    assert len(captioner.calls) == 2 and len(cache) == 0


@pytest.mark.parametrize(
    ("cache", "value", "kept"),
    [
        (CaptionCache(8, 1 << 20), "a caption", True),
        (DocumentCache(8, 1 << 20), ReadDocument("text", (Page("x"),)), False),
    ],
    ids=["caption: finished into the cache", "document: cancelled"],
)
async def test_one_cache_for_both_each_with_its_policy_for_work_nobody_waits_for(cache, value, kept):
    assert isinstance(cache, SharedCache)
    release, cancelled = asyncio.Event(), asyncio.Event()

    async def compute(indices: list[int]) -> list[object]:
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return [value for _ in indices]

    caller = asyncio.ensure_future(cache.get_or_compute(["k"], compute))
    await asyncio.sleep(0.01)
    assert cache.in_flight == 1
    caller.cancel()
    await asyncio.sleep(0.01)
    release.set()
    await asyncio.sleep(0.01)
    assert cancelled.is_set() is not kept and cache.in_flight == 0
    assert (cache.get("k") == value) is kept

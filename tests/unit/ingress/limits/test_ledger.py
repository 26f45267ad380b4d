"""The shared ledger: token buckets per key, the concurrency count and its leases, driven by a fake clock."""

from __future__ import annotations

import pytest

from deployments.ingress.limits.ledger import Caps, Ledger


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def ledger(lease_s: float = 600.0) -> tuple[Ledger, Clock]:
    clock = Clock()
    return Ledger(lease_s=lease_s, clock=clock), clock


def test_requests_per_minute_is_a_bucket_that_refills_evenly() -> None:
    book, clock = ledger()
    caps = Caps(requests_per_minute=3)
    verdicts = [book.admit("a", caps, 10) for _ in range(4)]
    assert [v.admitted for v in verdicts] == [True, True, True, False]
    refused = verdicts[-1]
    assert refused.limit == "requests" and refused.retry_after_s == pytest.approx(20.0)
    assert refused.requests is not None and refused.requests.remaining == 0 and refused.requests.limit == 3
    clock.now += 19.9
    assert not book.admit("a", caps, 10).admitted
    clock.now += 0.2
    assert book.admit("a", caps, 10).admitted  # one request back after 60/3 s


def test_keys_count_apart() -> None:
    book, _ = ledger()
    caps = Caps(requests_per_minute=1)
    assert book.admit("a", caps, 1).admitted and not book.admit("a", caps, 1).admitted
    assert book.admit("b", caps, 1).admitted


def test_tokens_are_reserved_then_settled_to_what_was_used() -> None:
    book, _ = ledger()
    caps = Caps(tokens_per_minute=1000)
    first = book.admit("a", caps, 600)
    assert first.tokens is not None and first.tokens.remaining == 400
    assert book.admit("a", caps, 500).limit == "tokens"  # 600 held by the first
    assert first.ticket is not None
    book.settle(first.ticket, 100)  # it used 100 of its 600
    again = book.admit("a", caps, 500)
    assert again.admitted and again.tokens is not None and again.tokens.remaining == 400
    assert again.ticket is not None
    book.settle(again.ticket, 900)  # used more than reserved: the bucket owes it
    later = book.admit("a", caps, 1)
    assert later.limit == "tokens" and later.retry_after_s > 0


def test_a_request_larger_than_the_bucket_is_too_large_and_never_waits() -> None:
    book, _ = ledger()
    verdict = book.admit("a", Caps(tokens_per_minute=100), 101)
    assert verdict.limit == "too_large" and "limit 100, requested 101" in verdict.message


def test_concurrency_holds_until_settled_or_the_lease_ends() -> None:
    book, clock = ledger(lease_s=30)
    caps = Caps(max_concurrent=2)
    a, b = book.admit("k", caps, 1), book.admit("k", caps, 1)
    assert a.admitted and b.admitted and book.in_flight("k") == 2
    assert book.admit("k", caps, 1).limit == "concurrency"
    assert a.ticket is not None
    book.settle(a.ticket, 1)
    book.settle(a.ticket, 1)  # twice changes nothing
    assert book.in_flight("k") == 1 and book.admit("k", caps, 1).admitted
    clock.now += 31  # both leases ended: their replica never settled them
    assert book.admit("k", caps, 1).admitted and book.in_flight("k") == 1


def test_an_edited_limit_takes_effect_on_the_next_admission() -> None:
    book, _ = ledger()
    for _ in range(5):
        assert book.admit("a", Caps(requests_per_minute=10), 1).admitted
    shrunk = book.admit("a", Caps(requests_per_minute=2), 1)  # 5 left of 10: cut to the new size
    assert shrunk.admitted and shrunk.requests is not None and shrunk.requests.remaining == 1
    assert book.admit("a", Caps(requests_per_minute=2), 1).admitted
    assert book.admit("a", Caps(requests_per_minute=2), 1).limit == "requests"


def test_unlimited_keys_have_no_windows() -> None:
    book, _ = ledger()
    verdict = book.admit("a", Caps(), 10**9)
    assert verdict.admitted and verdict.requests is None and verdict.tokens is None

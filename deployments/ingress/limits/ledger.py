"""The counts that every ingress replica's admissions share: per key name, a token bucket of
requests and one of tokens, each the size of its per-minute limit and refilled evenly over the
minute (the GCRA / token-bucket rule the OpenAI and Anthropic limits follow: a full minute's worth
may come at once, then it comes back at limit/60 per second), and the key's requests in flight.

A request is admitted whole or not at all: it takes one request, reserves its estimated prompt
plus its completion budget from the tokens, and holds a place among the key's concurrent requests;
`settle` gives back what it did not use (or takes what it used beyond), and frees its place. A
place whose replica never settled it (the replica died) is freed when its lease ends. Pure logic
with an injectable clock: the board actor holds one, the tests drive one directly.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Limit = Literal["requests", "tokens", "concurrency", "too_large"]


@dataclass(frozen=True)
class Caps:
    """A key's limits as the ledger takes them (None: unlimited)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None


@dataclass(frozen=True)
class Window:
    """One bucket as the headers tell it: its size, what is left, and the seconds until it is full again."""

    limit: int
    remaining: int
    reset_s: float


@dataclass(frozen=True)
class Verdict:
    """An admission: `ticket` to settle it with (None: refused, `limit` says by what, and
    `retry_after_s` when to try again), and the key's buckets after it.
    """

    ticket: int | None
    requests: Window | None = None
    tokens: Window | None = None
    limit: Limit | None = None
    retry_after_s: float = 0.0
    message: str = ""

    @property
    def admitted(self) -> bool:
        return self.ticket is not None


@dataclass
class _Bucket:
    size: int
    level: float
    at: float

    def refill(self, size: int, now: float) -> None:
        """Bring the level up to `now` (a new size, from an edited file, takes effect at once)."""
        self.level = min(size, self.level + (now - self.at) * size / 60.0)
        self.size, self.at = size, now

    def window(self) -> Window:
        missing = max(0.0, self.size - self.level)
        return Window(self.size, max(0, math.floor(self.level)), missing * 60.0 / self.size)

    def wait_s(self, need: float) -> float:
        """Seconds until `need` is in the bucket."""
        return max(0.0, (need - self.level) * 60.0 / self.size)


@dataclass
class _Key:
    requests: _Bucket | None = None
    tokens: _Bucket | None = None
    in_flight: int = 0


@dataclass
class _Ticket:
    name: str
    reserved: int
    expires: float


@dataclass
class Ledger:
    """The keys' shared counts and places in flight, with the admissions that change them (see the module's
    docstring).
    """

    lease_s: float = 600.0  # a place not settled within this is freed (its replica died)
    clock: Callable[[], float] = time.monotonic
    _keys: dict[str, _Key] = field(default_factory=dict)
    _tickets: OrderedDict[int, _Ticket] = field(default_factory=OrderedDict)  # by expiry: one lease for all
    _ids: itertools.count = field(default_factory=itertools.count)

    def admit(self, name: str, caps: Caps, tokens: int) -> Verdict:
        """Admit one request of key `name` that may use `tokens` (prompt estimate + completion budget)."""
        now = self.clock()
        self._expire(now)
        key = self._keys.setdefault(name, _Key())
        key.requests = _bucket(key.requests, caps.requests_per_minute, now)
        key.tokens = _bucket(key.tokens, caps.tokens_per_minute, now)
        refusal = self._refusal(key, caps, tokens)
        if refusal is not None:
            limit, wait_s, message = refusal
            return Verdict(None, _window(key.requests), _window(key.tokens), limit, wait_s, message)
        if key.requests is not None:
            key.requests.level -= 1
        if key.tokens is not None:
            key.tokens.level -= tokens
        key.in_flight += 1
        ticket = next(self._ids)
        self._tickets[ticket] = _Ticket(name, tokens if key.tokens is not None else 0, now + self.lease_s)
        return Verdict(ticket, _window(key.requests), _window(key.tokens))

    def _refusal(self, key: _Key, caps: Caps, tokens: int) -> tuple[Limit, float, str] | None:
        if key.tokens is not None and tokens > key.tokens.size:
            return (
                "too_large",
                0.0,
                f"Request too large for tokens per minute: limit {key.tokens.size}, requested {tokens} "
                "(the prompt's estimate plus max_tokens); ask for fewer max_tokens or a shorter prompt.",
            )
        if key.requests is not None and key.requests.level < 1:
            return (
                "requests",
                key.requests.wait_s(1),
                f"Rate limit reached for requests per minute: limit {key.requests.size}.",
            )
        if tokens and key.tokens is not None and key.tokens.level < tokens:  # a write, reserving none, is not refused
            return (
                "tokens",
                key.tokens.wait_s(tokens),
                f"Rate limit reached for tokens per minute: limit {key.tokens.size}, remaining "
                f"{max(0, math.floor(key.tokens.level))}, requested {tokens}.",
            )
        if caps.max_concurrent is not None and key.in_flight >= caps.max_concurrent:
            return (
                "concurrency",
                1.0,
                f"Too many concurrent requests: limit {caps.max_concurrent} in flight for this key.",
            )
        return None

    def settle(self, ticket: int, used_tokens: int) -> None:
        """The request of `ticket` ended having used `used_tokens` (prompt + completion): its
        reservation is corrected to that and its place freed. An unknown ticket (expired) is ignored.
        """
        held = self._tickets.pop(ticket, None)
        if held is None:
            return
        key = self._keys[held.name]
        key.in_flight -= 1
        if key.tokens is not None and held.reserved:
            key.tokens.refill(key.tokens.size, self.clock())
            key.tokens.level = min(key.tokens.size, key.tokens.level + held.reserved - used_tokens)

    def in_flight(self, name: str) -> int:
        key = self._keys.get(name)
        return key.in_flight if key else 0

    def _expire(self, now: float) -> None:
        while self._tickets and next(iter(self._tickets.values())).expires <= now:
            _, held = self._tickets.popitem(last=False)
            self._keys[held.name].in_flight -= 1


def _bucket(bucket: _Bucket | None, size: int | None, now: float) -> _Bucket | None:
    if size is None:
        return None
    if bucket is None:
        return _Bucket(size, float(size), now)
    bucket.refill(size, now)
    return bucket


def _window(bucket: _Bucket | None) -> Window | None:
    return None if bucket is None else bucket.window()

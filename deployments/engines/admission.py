"""When a request may enter: budgets that requests hold a share of, granted by priority (vLLM's
`priority`: lower first), fairly between tenants and in arrival order among equal priorities.

The decoder replica's `max_num_seqs` sequences are one (`Sequences`, a unit each, which also keeps
background work such as batch lines to the replica's idle capacity); llama.cpp's engine has two more:

- **Room in a KV pool that the slots share** (cells). llama.cpp's unified KV cache has no
  preemption: when the running sequences outgrow the pool, a decode step finds no free cells and
  llama.cpp fails every sequence of the batch ("Context size has been exceeded"). So each request
  reserves its prompt's cells plus its completion budget before it starts, and holds them until its
  stream ends. A request alone always fits: the pool holds at least `max_model_len` cells
  (`engine.kv_layout`). Slots with a stream of their own never wait for it.
- **Prompt tokens in prefill** (tokens, llama.cpp's `n_batch` by default). llama.cpp spreads each
  step's prompt tokens over every slot that is still in its prompt, so a burst of long prompts
  reaches its first tokens together, all late (16 prompts of 1,200 tokens on 2 cores: none before
  about 250 s, past most deadlines). Like vLLM's first-come-first-served chunked prefill, a
  request's prompt enters while the prompts still in prefill leave it room, and leaves the budget
  at its first token: the first requests answer first, and short prompts pass beside a long one.
  Decoding sequences are not held back; the work done is the same.

Either way a request that does not fit waits, by priority, then fairly between tenants (the API
keys of `ingress.limits`: one key's flood does not queue another key's request behind it), then in
arrival order (a large request is not starved by small ones of its priority behind it), until
enough is released; one larger than the budget is held to the budget (it runs alone). Waiting is
cancellable: a request whose client leaves or whose deadline passes stops waiting at once.

Fair share by default (a budget's `headroom`: one sequence; a slot's worth of a shared KV pool).
Fair queueing orders the waiters, but nothing is preempted (llama.cpp cannot give a running
sequence's cells back), so a key arriving beside another key's flood would still wait for one of
the flood's sequences to end: tens of seconds on a CPU. So, while a limits file is in force (the
request names its tenant), a tenant that already holds units of a budget is granted more only while
`headroom` units stay free after it, and a tenant holding none may take them and pass the waiters
so held back: its first request starts at once, whatever its priority. A tenant with an explicit
`share` is held to that instead. The cost: one tenant alone holds at most `size - headroom` (15
sequences of 16), and a third tenant arriving while a second holds the headroom waits, first in the
fair queue, for a release. With no limits file (no tenant) the whole budget is everyone's.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from deployments.protocol.replica import BACKGROUND_PRIORITY


@dataclass
class _Waiter:
    need: int
    future: asyncio.Future[None]
    order: tuple[int, float, int]  # (priority, the tenant's start tag, arrival): the queue's order
    tenant: str = ""
    cap: int | None = None  # the most units the tenant may hold at once (None: the budget's size)
    granted: bool = field(default=False)

    @property
    def priority(self) -> int:
        return self.order[0]


class Budget:
    """`size` units shared by every request; `reserve(need)` holds `need` of them for a block, or
    until the block calls the release it was given.

    Waiters are ordered by priority, then fairly between tenants (the API keys, `ingress.limits`):
    start-time fair queueing, where each request's tag starts where its tenant's last one ended (or
    at the budget's virtual time, if later) and costs its share of the budget, so that a tenant with
    one request waiting is served next to, not behind, a tenant with a hundred. One tenant's requests
    keep their arrival order; with a single tenant (no keys) the queue is first come, first served.
    A tenant may be capped to `cap` units at once: its waiters beyond it are passed over.

    `headroom` units are held back from named tenants (not "") that already hold some and have no
    cap of their own, for a tenant holding none (the module's "Fair share by default"): such a
    tenant's waiter passes any waiter that does not fit. At most `size - 1`: a tenant alone always
    gets a unit.
    """

    def __init__(self, size: int, headroom: int = 0) -> None:
        self.size = size
        self.headroom = max(0, min(headroom, size - 1))
        self.reserved = 0
        self._queue: list[_Waiter] = []  # sorted by (priority, start tag, arrival)
        self._arrivals = itertools.count()
        self._virtual = 0.0  # the start tag of the last request granted
        self._finish: dict[str, float] = {}  # each tenant's last tag's end
        self._held: dict[str, int] = {}  # units held, by tenant

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @asynccontextmanager
    async def reserve(
        self, need: int, priority: int = 0, tenant: str = "", share: float | None = None
    ) -> AsyncIterator[Callable[[], None]]:
        """`need` units held for the block; `priority`: lower is granted first; `tenant`: whose
        request it is, for fair queueing; `share`: the most of the budget the tenant may hold.
        """
        need = min(need, self.size)
        cap = None if share is None else max(need, int(share * self.size))
        start = max(self._virtual, self._finish.get(tenant, 0.0))
        self._finish[tenant] = start + need / self.size
        waiter = _Waiter(need, asyncio.get_running_loop().create_future(), (priority, start, next(self._arrivals)))
        waiter.tenant, waiter.cap = tenant, cap
        bisect.insort(self._queue, waiter, key=lambda w: w.order)
        self._grant()
        if not waiter.granted:
            try:
                await waiter.future
            except BaseException:
                if waiter.granted:  # granted as it was cancelled: give the units back
                    self._release(waiter)
                else:
                    self._queue.remove(waiter)
                    self._grant()  # the ones behind it may fit now
                raise
        held = True

        def release() -> None:
            nonlocal held
            if held:
                held = False
                self._release(waiter)

        try:
            yield release
        finally:
            release()

    def _admits(self, waiter: _Waiter) -> bool:
        """Whether `waiter` may be granted now, room aside: its tenant is within its cap."""
        return waiter.cap is None or self._held.get(waiter.tenant, 0) + waiter.need <= waiter.cap

    def _newcomer(self, waiter: _Waiter) -> bool:
        """A named tenant holding nothing: the headroom is for it."""
        return bool(self.headroom and waiter.tenant and not self._held.get(waiter.tenant))

    def _room_for(self, waiter: _Waiter) -> int:
        """The units that may be reserved once `waiter` is granted: all but the headroom for a named
        tenant that already holds some (and has no cap of its own), the whole budget otherwise.
        """
        if waiter.tenant and waiter.cap is None and self._held.get(waiter.tenant):
            return self.size - self.headroom
        return self.size

    def _take(self, waiter: _Waiter) -> None:
        self.reserved += waiter.need
        self._held[waiter.tenant] = self._held.get(waiter.tenant, 0) + waiter.need
        self._virtual = max(self._virtual, waiter.order[1])

    def _release(self, waiter: _Waiter) -> None:
        self.reserved -= waiter.need
        left = self._held[waiter.tenant] - waiter.need
        if left:
            self._held[waiter.tenant] = left
        else:
            del self._held[waiter.tenant]
            if self._finish.get(waiter.tenant, 0.0) <= self._virtual:
                self._finish.pop(waiter.tenant, None)  # idle: its next tag starts at the virtual time anyway
        self._grant()

    def _grant(self) -> None:
        """Grant the waiters in the queue's order while they fit, passing over those not admitted
        (a capped tenant, background work on a busy replica); the first admitted one that does not
        fit stops the grants, so that a large request is not starved by small ones behind it, except
        for a newcomer's (`_newcomer`), which passes it while it fits: their number is bounded by
        the tenants', since each holds units once granted. A tenant passed over keeps its order.
        """
        passed: set[str] = set()  # tenants with a waiter that did not fit: their later ones wait too
        i = 0
        while i < len(self._queue):
            waiter = self._queue[i]
            if waiter.tenant in passed or not self._admits(waiter) or (passed and not self._newcomer(waiter)):
                i += 1
                continue
            if self.reserved + waiter.need > self._room_for(waiter):
                if not self.headroom or self._newcomer(waiter):
                    return
                passed.add(waiter.tenant)
                i += 1
                continue
            self._queue.pop(i)
            waiter.granted = True
            self._take(waiter)
            if not waiter.future.done():
                waiter.future.set_result(None)


class Sequences(Budget):
    """A decoder replica's `max_num_seqs` sequences (a unit each), with background work on idle
    capacity. Background work is a request of `BACKGROUND_PRIORITY` or later (every batch line).
    Priority alone orders only the requests that wait for a sequence; on a CPU every running
    sequence slows each step. So while a foreground request is on the replica (waiting or running),
    or was within the last `quiet_s`, at most `busy_share` background sequences run (none by
    default: one beside a chat made its time to first token 1.8x on 2 cores) and the others wait,
    later priorities after earlier ones; once the replica has been quiet for `quiet_s` they may all
    start. Background sequences already running when a foreground request arrives finish as they
    are (nothing is preempted). One sequence is the headroom kept for a tenant with none running
    (`Budget`); a tenant's background sequences count as running.
    """

    def __init__(self, size: int, quiet_s: float = 1.0, busy_share: int = 0, headroom: int = 1) -> None:
        super().__init__(size, headroom)
        self.quiet_s = quiet_s
        self.busy_share = busy_share
        self.foreground = 0  # foreground requests on the replica, waiting or running
        self.background = 0  # background sequences granted
        self._quiet_since = -float("inf")  # when the last foreground request left (the loop's clock)

    @asynccontextmanager
    async def reserve(
        self, need: int, priority: int = 0, tenant: str = "", share: float | None = None
    ) -> AsyncIterator[Callable[[], None]]:
        if priority >= BACKGROUND_PRIORITY:
            async with super().reserve(need, priority, tenant, share) as release:
                yield release
            return
        self.foreground += 1
        try:
            async with super().reserve(need, priority, tenant, share) as release:
                yield release
        finally:
            self.foreground -= 1
            if not self.foreground:
                self._quiet_since = asyncio.get_running_loop().time()
                self._when_quiet()

    def _when_quiet(self) -> None:
        """Grant the background waiters once the replica has been quiet for `quiet_s` (a timer's
        callback may run a little early: then again, later).
        """
        if self.foreground:
            return  # the last foreground request to leave sets the next timer
        left = self._quiet_since + self.quiet_s - asyncio.get_running_loop().time()
        if left > 0:
            asyncio.get_running_loop().call_later(left, self._when_quiet)
        else:
            self._grant()

    def _admits(self, waiter: _Waiter) -> bool:
        if not super()._admits(waiter):
            return False
        if waiter.priority < BACKGROUND_PRIORITY or self.background < self.busy_share:
            return True
        quiet_for = asyncio.get_running_loop().time() - self._quiet_since
        return not self.foreground and quiet_for >= self.quiet_s

    def _take(self, waiter: _Waiter) -> None:
        super()._take(waiter)
        if waiter.priority >= BACKGROUND_PRIORITY:
            self.background += waiter.need

    def _release(self, waiter: _Waiter) -> None:
        if waiter.priority >= BACKGROUND_PRIORITY:
            self.background -= waiter.need
        super()._release(waiter)

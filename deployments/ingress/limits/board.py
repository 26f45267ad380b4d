"""The one place where every ingress replica's admissions are counted: a named Ray actor per Serve
application holding the `Ledger` in its memory (detached, no CPU, restarted by Ray if it dies,
found or started by each replica as it starts). Unlike what the service stores (stored responses,
conversations, files: records in the storage root, `deployments.state`), the counts live only as
long as the actor: they are a minute's worth, and every admission must see every other's at once.

A request costs one awaited call (`admit`, about a millisecond on one node: docs/benchmarks.md); its
settlement is sent without waiting. If the board cannot be reached in time the request is admitted
without limits and a warning is logged (at most once a minute): limits share capacity fairly, they
are not the service's access control (the keys are), and a lost board must not stop the service.
A board that restarted starts with full buckets.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

import ray

from deployments.ingress.limits.ledger import Caps, Ledger, Verdict

logger = logging.getLogger("ray.serve")


class BoardPort(Protocol):
    """What the limiter calls: `LimitsBoard`, or in process a ledger of its own (the unit tests')."""

    async def admit(self, name: str, caps: Caps, tokens: int) -> Verdict | None: ...

    def settle(self, ticket: int, used_tokens: int) -> None: ...


class _LedgerActor:
    """The ledger behind an actor's methods (ray.remote of the class itself keeps its calls exact)."""

    def __init__(self, lease_s: float) -> None:
        self._ledger = Ledger(lease_s=lease_s)

    def admit(self, name: str, caps: Caps, tokens: int) -> Verdict:
        return self._ledger.admit(name, caps, tokens)

    def settle(self, ticket: int, used_tokens: int) -> None:
        self._ledger.settle(ticket, used_tokens)


class LimitsBoard:
    """An ingress replica's client of its application's limits board (`name`)."""

    def __init__(self, name: str, lease_s: float, timeout_s: float = 2.0) -> None:
        self._name = name
        self._lease_s = lease_s
        self._timeout_s = timeout_s
        self._actor: Any = None
        self._warned_at = -float("inf")

    def start(self) -> None:
        """Start the actor or find it (without waiting for it: the first admission does)."""
        self._actor = (
            ray.remote(_LedgerActor)
            .options(name=self._name, get_if_exists=True, lifetime="detached", num_cpus=0, max_restarts=-1)
            .remote(self._lease_s)
        )

    async def admit(self, name: str, caps: Caps, tokens: int) -> Verdict | None:
        """The board's verdict; None when it could not be asked (the request goes on unlimited)."""
        if self._actor is None:
            self.start()
        try:
            verdict: Verdict = await asyncio.wait_for(self._actor.admit.remote(name, caps, tokens), self._timeout_s)
            return verdict
        except Exception as exc:  # unreachable, restarting, slow: admitted unlimited, said in the log
            if time.monotonic() - self._warned_at > 60:
                self._warned_at = time.monotonic()
                logger.warning(
                    "limits board %r did not answer (%s); requests are admitted without limits until it does",
                    self._name,
                    type(exc).__name__,
                )
            return None

    def settle(self, ticket: int, used_tokens: int) -> None:
        """Tell the board what the request used (not awaited: the response has gone)."""
        if self._actor is not None:
            self._actor.settle.remote(ticket, used_tokens)

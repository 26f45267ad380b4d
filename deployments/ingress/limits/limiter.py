"""The keys' limits at the door: a pure ASGI middleware inside the API-key guard (it knows the
caller) and around every route.

For every request it names the caller (`KeyTable.identify`) in the request's state and its record
(the access log's `key`, the decoders' fair-queueing `tenant`). How a route is counted is its API's
declaration (`limits.counting`: the table the builder gives, `apis/counting.py`). The body is the one
the guard read (`guard.body_of`), never read again. A body that names a model the key may not use is
answered as an unknown model (404 `model_not_found`, listing only the models the key may use:
nothing tells it the others exist). A request to a route that generates or reads a model is
admitted by the application's board (`board.LimitsBoard`) against the key's requests and tokens per
minute and its concurrent requests, reserving its estimated tokens (`estimate`); a request that
writes state is admitted as a request, reserving no tokens. Over a limit it is a 429 in its API's
shape with `Retry-After` (`headers`). Every admitted response carries the key's rate-limit headers,
and holds its place among the key's concurrent requests until it has ended: its last byte handed to
the server and the server's word that the response is complete (ASGI's `http.disconnect`, which
Serve's proxy relays once it has sent the last byte; a server's `send` may only queue it), or its
client gone. Then it is settled to the tokens it used (the record's counts) and counted in the
key's metrics. The Responses WebSocket's turns and the batch lines are admitted and settled by the
same `Limiter`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import MutableHeaders, State
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deployments.errors import InvalidRequestError, ModelNotFoundError, RateLimitError
from deployments.ingress.guard import anthropic_route, body_of, reject, route_of
from deployments.ingress.limits import estimate
from deployments.ingress.limits.board import BoardPort
from deployments.ingress.limits.counting import Counted, CountingTable
from deployments.ingress.limits.headers import rate_headers, retry_headers
from deployments.ingress.limits.ledger import Caps, Verdict
from deployments.ingress.limits.table import KeyIdentity, KeyTable
from deployments.ingress.served_models import ServedModels
from deployments.monitoring.access_log import RequestRecord, record_of
from deployments.monitoring.metrics import Recorder
from deployments.state import owners

STATE_KEY = "mmserve_key"  # the request's `state` entry: the caller's `KeyIdentity`
DELIVERY_WAIT_S = 10.0  # the longest a finished response waits for the server's word that it was sent
_COUNTED_METHODS = frozenset({"POST", "DELETE"})  # what may generate or write; a read is never counted


def key_of(state: Any) -> KeyIdentity | None:
    """The caller as the limits know it (None: no limits file)."""
    identity = getattr(state, STATE_KEY, None)
    return identity if isinstance(identity, KeyIdentity) else None


def model_allowed(state: Any) -> Callable[[str], bool]:
    """Whether the request's caller may use a model."""
    identity = key_of(state)
    return identity.allows if identity is not None else lambda model: True


@dataclass(frozen=True)
class Admission:
    """An admitted request: its ticket at the board (None: the board could not be asked) and the
    headers that tell its key's buckets.
    """

    identity: KeyIdentity
    ticket: int | None
    headers: dict[str, str]


@dataclass(frozen=True)
class Limiter:
    """The limits of one ingress replica: who each caller is, and their admission and settlement;
    `routes`: how each route is counted, as the APIs declare it (the builder's `apis/counting.py`).
    """

    table: KeyTable
    board: BoardPort
    served: ServedModels  # their names, and the 404 of a model not served
    default_max_tokens: Mapping[str, int]  # each model's, for a request that sets none
    metrics: Recorder
    estimator: estimate.Estimator = field(default_factory=estimate.Estimator)  # with the stores a request names
    routes: CountingTable = field(kw_only=True)

    def check_model(self, identity: KeyIdentity, model: object) -> None:
        """A model the key may not use is unknown to it: `ModelNotFoundError`, listing only its models."""
        if isinstance(model, str) and not identity.allows(model):
            raise self.served.unknown(model, identity.allows)

    async def admit(
        self, identity: KeyIdentity, route: str, request: dict[str, Any], anthropic: bool, owner: bytes | None = None
    ) -> Admission:
        """Admit a request to a model's endpoint `route` (one that generates or reads a model, as
        `routes` declares it), reserving its estimated tokens; over a limit, `RefusedError`. `owner`: the
        caller's key digest, whose stored objects the request may name.
        """
        caps = identity.caps
        if caps == Caps():  # nothing to count: no round trip to the board
            return Admission(identity, None, {})
        started = time.monotonic()
        tokens = 0  # without a token limit nothing reads the estimate
        if caps.tokens_per_minute is not None:
            model = request.get("model")
            base = (model if isinstance(model, str) else self.served.names[0]).partition(":")[0]
            declared = self.routes.route("POST", route)
            reads = declared is not None and declared.counted is Counted.READS  # nothing generated: no budget
            default = self.default_max_tokens.get(base, 256) if not reads else None
            budget = declared.budget if declared is not None else None
            try:
                cost = await self.estimator.estimate(request, default, owner, budget)
            except RecursionError:  # nested deeper than Python reads: the 400 the route gives such a body
                raise InvalidRequestError("There was an error parsing the body: it is nested too deeply.") from None
            tokens = cost.reserve(caps.tokens_per_minute)
        return await self._admit(identity, tokens, anthropic, started)

    async def admit_write(self, identity: KeyIdentity, anthropic: bool = False) -> Admission:
        """Admit a request that writes state (`Counted.WRITES`): one request and a place among the
        key's concurrent ones, no tokens; over a limit, `RefusedError`.
        """
        if identity.caps == Caps():
            return Admission(identity, None, {})
        return await self._admit(identity, 0, anthropic, time.monotonic())

    async def _admit(self, identity: KeyIdentity, tokens: int, anthropic: bool, started: float) -> Admission:
        verdict = await self.board.admit(identity.bucket, identity.caps, tokens)
        tags = {"key": identity.name}
        self.metrics.observe("key_admission_seconds", time.monotonic() - started, tags=tags)
        if verdict is None:  # the board is unreachable: admitted without limits (logged by the board)
            return Admission(identity, None, {})
        headers = rate_headers(verdict, anthropic)
        if verdict.ticket is None:
            limit = verdict.limit or "requests"
            self.metrics.inc("key_rate_limited", tags={**tags, "limit": limit})
            raise RefusedError(verdict, headers={**headers, **retry_headers(verdict)})
        return Admission(identity, verdict.ticket, headers)

    async def admit_waiting(self, identity: KeyIdentity, route: str, request: dict[str, Any]) -> Admission:
        """Admit a batch line: over a limit it waits until the key's buckets let it in (the caller's
        deadline bounds the wait), never a 429; a line too large ever to fit is a 400.
        """
        while True:
            try:
                return await self.admit(identity, route, request, anthropic=False)
            except RefusedError as refused:
                if refused.limit == "too_large":
                    raise InvalidRequestError(refused.message, param="max_tokens") from None
                await asyncio.sleep(min(max(refused.retry_after_s, 0.05), 60.0))

    def settle(self, admission: Admission, record: RequestRecord) -> None:
        """The request has ended: its tokens (the record's counts) settle its reservation and count in
        its key's metrics.
        """
        prompt, completion = record.prompt_tokens or 0, record.completion_tokens or 0
        if admission.ticket is not None:
            self.board.settle(admission.ticket, prompt + completion)
        tags = {"key": admission.identity.name}
        self.metrics.inc("key_requests", tags=tags)
        self.metrics.inc("key_prompt_tokens", prompt, tags=tags)
        self.metrics.inc("key_completion_tokens", completion, tags=tags)
        if record.queued_s is not None:
            self.metrics.observe("key_queue_time_seconds", record.queued_s, tags=tags)


class RefusedError(RateLimitError):
    """A 429 of the limits: the limit met, when to try again, and the headers its answer carries."""

    def __init__(self, verdict: Verdict, *, headers: dict[str, str]) -> None:
        super().__init__(verdict.message, limit=verdict.limit or "requests")
        self.limit = verdict.limit or "requests"
        self.retry_after_s = verdict.retry_after_s
        self.headers = headers


class KeyLimiter:
    """The middleware that applies the keys' limits (see the module's docstring); without a `limiter` it only
    passes requests on.
    """

    def __init__(self, app: ASGIApp, limiter: Limiter | None) -> None:
        self.app = app
        self._limiter = limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        limiter = self._limiter
        if limiter is None or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        digest = state.get(owners.STATE_KEY)
        identity = limiter.table.identify(digest if isinstance(digest, bytes) else None)
        state[STATE_KEY] = identity
        if scope["type"] == "websocket" or scope["method"] not in _COUNTED_METHODS:
            await self.app(scope, receive, send)
            return
        record = record_of(State(state))
        record.tenant = identity.tenant
        route = route_of(scope)
        counted = limiter.routes.of(scope["method"], route)
        if counted is None or counted is Counted.UNCOUNTED:
            await self.app(scope, receive, send)
            return
        request: Any = None
        if counted.reads_body:  # any other body is not looked at here (an upload streams on untouched)
            body = body_of(scope)
            if body is None:
                raise RuntimeError(f"{route}: the limits read the body the guard read, and the guard read none")
            request = _parsed(body)
        try:
            if counted.reads_body:
                limiter.check_model(identity, request.get("model") if isinstance(request, dict) else None)
            if not counted.admitted or (counted.reads_body and not isinstance(request, dict)):
                await self.app(scope, receive, send)  # not counted, or a body that its route refuses
                return
            if counted.reads_body:
                owner = digest if isinstance(digest, bytes) else None
                admission = await limiter.admit(identity, route, request, anthropic_route(scope), owner)
            else:
                admission = await limiter.admit_write(identity, anthropic_route(scope))
        except (ModelNotFoundError, RefusedError, InvalidRequestError) as refused:
            await reject(refused, getattr(refused, "headers", {}), scope, receive, send)
            return
        await _admitted(self.app, limiter, admission, record, scope, receive, send)


async def _admitted(
    app: ASGIApp,
    limiter: Limiter,
    admission: Admission,
    record: RequestRecord,
    scope: Scope,
    receive: Receive,
    send: Send,
) -> None:
    """Serve an admitted request and settle it once its response has ended: sent whole (the server
    says so) or its client gone.
    """
    complete = False

    async def send_with_headers(message: Message) -> None:
        nonlocal complete
        if message["type"] == "http.response.start":
            MutableHeaders(scope=message).update(admission.headers)
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            complete = True
        await send(message)

    try:
        await app(scope, receive, send_with_headers)
        if complete:
            await _sent(receive)
    finally:
        limiter.settle(admission, record)


async def _sent(receive: Receive) -> None:
    """Wait for the server's word that the response has gone (ASGI's `http.disconnect`, sent once the
    response is complete or the client has left): under Serve the app's `send` only queues each
    message for the proxy, so the app may end long before its client has the first bytes.
    """
    with suppress(TimeoutError):
        async with asyncio.timeout(DELIVERY_WAIT_S):
            while (await receive())["type"] == "http.request":  # a body the route never read
                pass


def _parsed(body: bytes) -> Any:
    """The JSON body; None when it is none (its route says what is wrong with it: the same 400 as
    without limits, also for a body nested too deeply to parse).
    """
    try:
        return json.loads(body) if body else None
    except (ValueError, RecursionError):
        return None

"""One access-log line per request, and the ingress's request metrics, from one place.

`AccessLog` is a pure ASGI middleware (streamed responses pass through untouched) around every
route, the API-key guard included. It puts a `RequestRecord` in the request's state, which the
request logic fills (model, images, caption-cache hits, degradation, tokens, time to first token),
and when the response's last byte has gone (or the client has gone) it writes the line and records
`mmserve_http_requests`, `mmserve_requests_rejected` and the image and cache counters. A WebSocket
connection's turns (the Responses API's WebSocket mode) each get their own record, line and
metrics, written when the turn ends (`turn_log_of`).

The line is readable text with the fields as ``key=value``; with `logging_config.encoding: JSON`
in serve_config.yaml the same fields are JSON keys (Serve's ``ray_serve_extra_fields``), next to
Serve's own ``request_id`` and ``route``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deployments.monitoring.metrics import Recorder
from deployments.protocol.replica import Tenant

logger = logging.getLogger("ray.serve")

STATE_KEY = "record"
TURN_LOG_KEY = "turn_log"


@dataclass
class ImageStats:
    """The images of one request: how many were accepted, their bytes and pixels, and each URL fetch."""

    count: int = 0
    nbytes: int = 0
    pixels: int = 0
    fetches: list[tuple[str, float, bool]] = field(default_factory=list)  # (scheme, seconds, fetched)

    def accepted(self, data: bytes, pixels: int) -> None:
        self.count += 1
        self.nbytes += len(data)
        self.pixels += pixels

    def fetched(self, scheme: str, seconds: float, ok: bool) -> None:
        self.fetches.append((scheme, seconds, ok))


@dataclass
class RequestRecord:
    """What one request's access-log line and metrics say; the request logic fills what it knows."""

    request_id: str = "unknown"
    method: str = ""
    path: str = ""
    started: float = field(default_factory=time.monotonic)
    model: str | None = None
    status: int = 0
    error: str | None = None  # the OpenAI error's code (or type), also for an error event in a stream
    error_status: int | None = None  # the error's status when the HTTP status had already gone out as 200
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    truncated_prompt_tokens: int | None = None  # dropped to fit the context (context_overflow: truncate)
    ttft_s: float | None = None
    images: ImageStats = field(default_factory=ImageStats)
    cache_hits: int = 0
    cache_misses: int = 0
    degraded: str | None = None
    set_aside: str | None = None  # the request's tools that were not offered to the model (hosted tools), by type
    batch: str | None = None  # the batch of a batch line (`Ingress.batch_line`); None for HTTP requests
    key_digest: bytes | None = None  # the caller's API key's SHA-256 (documents named by file_id); never logged
    tenant: Tenant | None = None  # whose request, as the limits know it (`ingress.limits`); None: no limits file
    queued_s: float | None = None  # how long its first sequence waited for the decoder (the decoder's count)
    session: str | None = (
        None  # the client's session hint (x-session-id, a conversation, a user id): routing's tie-breaker
    )

    def first_token(self) -> None:
        if self.ttft_s is None:
            self.ttft_s = time.monotonic() - self.started

    def fields(self, duration_s: float) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "model": self.model,
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "truncated_prompt_tokens": self.truncated_prompt_tokens,
            "ttft_s": None if self.ttft_s is None else round(self.ttft_s, 4),
            "duration_s": round(duration_s, 4),
            "images": self.images.count,
            "cache_hits": self.cache_hits,
            "degraded": self.degraded,
            "set_aside": self.set_aside,
            "error": self.error,
            "batch": self.batch,
            "key": self.tenant.name if self.tenant else None,
        }


def record_of(state: Any) -> RequestRecord:
    """The request's record (Starlette's `request.state`); a detached one outside `AccessLog`."""
    record = getattr(state, STATE_KEY, None)
    return record if isinstance(record, RequestRecord) else RequestRecord()


def turn_log_of(state: Any) -> Callable[[RequestRecord], None]:
    """What logs a WebSocket turn's record (its line and metrics, as a request's); a no-op outside
    `AccessLog`.
    """
    log = getattr(state, TURN_LOG_KEY, None)
    return log if callable(log) else (lambda record: None)


def error_code(body: dict[str, Any]) -> str:
    """An OpenAI error body's `error` field in the access log: its code, else its type."""
    error = body["error"]
    return str(error.get("code") or error.get("type"))


def _error_of(body: bytes) -> str | None:
    try:
        return error_code(json.loads(body))
    except Exception:
        return None


class AccessLog:
    """The middleware that writes each request's access-log line and metrics (see the module's docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: Recorder,
        request_id: Callable[[Scope], str],
        routes: list[BaseRoute],
        models: Sequence[str] = (),
    ) -> None:
        """`request_id(scope)`: the id Serve logs the request under; `routes`: the app's, for the
        `route` label of requests that never reached one (a 401 from the guard); `models`: the served
        models, the `model` label of a request that names one (others keep the recorder's default,
        so that clients cannot make up label values).
        """
        self.app = app
        self._metrics = metrics
        self._request_id = request_id
        self._routes = routes
        self._models = frozenset(models)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # a line and metrics per turn, when the socket ends one
            scope.setdefault("state", {})[TURN_LOG_KEY] = lambda record: self.finish(record, scope)
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record = RequestRecord(request_id=self._request_id(scope), method=scope["method"], path=scope["path"])
        record.session = session_header(scope)
        scope.setdefault("state", {})[STATE_KEY] = record
        error_body = b""

        async def send_and_watch(message: Message) -> None:
            nonlocal error_body
            if message["type"] == "http.response.start":
                record.status = message["status"]
            elif message["type"] == "http.response.body" and record.status >= 400 and len(error_body) < 65536:
                error_body += message.get("body", b"")
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            if record.status >= 400 and record.error is None:
                record.error = _error_of(error_body)
            self.finish(record, scope)

    def _route_of(self, scope: Scope) -> str:
        """The route's path pattern (label values stay bounded), or "unmatched" for a path no route has."""
        route = scope.get("route")
        if route is None:
            route = next((r for r in self._routes if r.matches(scope)[0] != Match.NONE), None)
        return getattr(route, "path", None) or "unmatched"

    def finish(self, record: RequestRecord, scope: Scope) -> None:
        log_access(record)
        route = self._route_of(scope)
        m = self._metrics
        model = {"model": record.model} if record.model in self._models else {}
        m.inc("http_requests", tags={**model, "route": route, "status": str(record.status or 499)})
        if record.error is not None:
            status = record.error_status or record.status
            m.inc("requests_rejected", tags={**model, "status": str(status), "reason": record.error})
        if record.degraded is not None:
            m.inc("requests_degraded", tags={**model, "reason": record.degraded})
        m.inc("caption_cache_hits", record.cache_hits, tags=model)
        m.inc("caption_cache_misses", record.cache_misses, tags=model)
        m.inc("image_bytes", record.images.nbytes, tags=model)
        m.inc("image_pixels", record.images.pixels, tags=model)
        for scheme, seconds, ok in record.images.fetches:
            if ok:
                m.observe("image_fetch_latency_seconds", seconds, tags=model)
            else:
                m.inc("image_fetch_failures", tags={**model, "scheme": scheme})


def log_access(record: RequestRecord) -> None:
    """The request's access-log line, `access key=value ...`, its fields also Serve's JSON log fields."""
    fields = record.fields(time.monotonic() - record.started)
    text = " ".join(f"{k}={'-' if v is None else v}" for k, v in fields.items())
    logger.info("access %s", text, extra={"ray_serve_extra_fields": _without_serve_keys(fields)})


def _without_serve_keys(fields: dict[str, Any]) -> dict[str, Any]:
    """Serve's JSON lines already carry `request_id` (the same id) and refuse duplicate keys."""
    return {k: v for k, v in fields.items() if k != "request_id"}


SESSION_HEADER = b"x-session-id"  # Ray Serve's own name for it (RAY_SERVE_SESSION_ID_HEADER_KEY's default)


def session_header(scope: Scope) -> str | None:
    """The request's `x-session-id` (at most 256 characters), a hint the decoders' router keeps a session
    on one replica with (`routing.choice`).
    """
    for key, value in scope.get("headers") or ():
        if key.lower() == SESSION_HEADER:
            return value.decode("latin-1")[:256] or None
    return None

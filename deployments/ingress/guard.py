"""Request guard: API keys and the body size cap, checked before any route runs.

A WebSocket handshake (the Responses API's WebSocket mode) needs a key as a request does: without
one it is refused with the 401 as an HTTP response where the server can send one (the ASGI
denial-response extension), or closed with code 1008 (policy violation) before it opens.

A pure ASGI middleware rather than Starlette's ``BaseHTTPMiddleware``, so streamed responses pass
through it untouched. Rejections are OpenAI-shaped: 401 ``invalid_api_key`` (with
``WWW-Authenticate: Bearer``) and 413 ``request_too_large``; the body is never read past the cap.
A key comes as ``Authorization: Bearer <key>`` or, as Anthropic's clients send it, ``x-api-key``;
the rejections of Anthropic's routes (`anthropic_route`) are in Anthropic's shape. More keys may
be accepted by their digests (`ExtraKeys`: the builder gives the limits file's named keys). The
accepted key's digest stays in the request's state: the request's caller, who owns what it stores
(`owners`), and whose limits apply. The body it read stays there too (`body_of`), so that nothing
inside it reads the body again.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from deployments.config import ServerConfig
from deployments.errors import AuthenticationError, PayloadTooLargeError, ServiceError, as_anthropic, error_body
from deployments.monitoring.access_log import record_of
from deployments.state import owners

BODY_KEY = "mmserve_body"  # the request's `state` entry: the body the guard read (`body_of`)
ANTHROPIC_PATH = "/v1/messages"
OPEN_PATHS = frozenset({"/health", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class KeyRing:
    """Accepted API keys, kept as SHA-256 digests and compared in constant time."""

    def __init__(self, keys: list[str]) -> None:
        self._digests = [_digest(k) for k in dict.fromkeys(keys)]

    def __bool__(self) -> bool:
        return bool(self._digests)

    def __len__(self) -> int:
        return len(self._digests)

    def accepts(self, authorization: str | None) -> bool:
        """`Authorization: Bearer <key>` with an accepted key. Every key is compared, match or not."""
        return self.match(authorization) is not None

    def match(self, authorization: str | None, more: Sequence[bytes] = ()) -> bytes | None:
        """The digest of the accepted key (or of one of the digests `more`) that `Authorization:
        Bearer <key>` presents; None for none. Every key is compared, match or not.
        """
        scheme, _, token = (authorization or "").partition(" ")
        presented = _digest(token.strip())
        matched = False
        for digest in (*self._digests, *more):
            matched |= hmac.compare_digest(digest, presented)
        return presented if matched and scheme.lower() == "bearer" else None


class ExtraKeys(Protocol):
    """More keys the guard accepts, by their SHA-256 digests, read for each request (they may change:
    the limits file's named keys, `limits.table.KeyTable`).
    """

    @property
    def digests(self) -> Sequence[bytes]: ...


FILES_PATH = "/v1/files"
MULTIPART_MARGIN = 1024 * 1024  # a multipart form's headers and boundaries around the file


@dataclass(frozen=True)
class GuardSettings:
    """What the guard checks: the accepted keys and the body caps."""

    keys: KeyRing
    max_body_bytes: int
    max_upload_bytes: int = 0  # an upload to /v1/files: the file's cap and the form around it
    extra_keys: ExtraKeys | None = None  # more accepted keys (the limits file's named keys)

    def match(self, authorization: str | None) -> bytes | None:
        """The digest of the accepted key presented, if any."""
        return self.keys.match(authorization, self.extra_keys.digests if self.extra_keys else ())

    @property
    def required(self) -> bool:
        """Whether a key is required: some are set, here or among the extra keys."""
        return bool(self.keys) or bool(self.extra_keys and self.extra_keys.digests)

    def cap(self, scope: Scope) -> int:
        """The body cap of a request: /v1/files' uploads have their own."""
        if route_of(scope) == FILES_PATH:
            return max(self.max_body_bytes, self.max_upload_bytes)
        return self.max_body_bytes

    @classmethod
    def from_config(
        cls, server: ServerConfig, environ: Mapping[str, str] = os.environ, extra_keys: ExtraKeys | None = None
    ) -> GuardSettings:
        """Keys from the config plus those in the `api_keys_env` variable (comma-separated), and
        `extra_keys` (the limits file's named keys).
        """
        keys = list(server.api_keys)
        if server.api_keys_env:
            keys += [k.strip() for k in environ.get(server.api_keys_env, "").split(",") if k.strip()]
        return cls(
            KeyRing(keys),
            server.max_body_bytes,
            server.batches.max_file_bytes + MULTIPART_MARGIN,
            extra_keys=extra_keys,
        )


class RequestGuard:
    """ASGI middleware with the settings of the ingress replica whose app it guards."""

    def __init__(self, app: ASGIApp, settings: GuardSettings) -> None:
        self.app = app
        self._settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        settings = self._settings
        headers = Headers(scope=scope)
        required = settings.required
        key = settings.match(_presented(headers)) if required else None
        if key is not None:  # who makes the request: the owner of what it stores (`owners`)
            scope.setdefault("state", {})[owners.STATE_KEY] = key
        elif required and route_of(scope) not in OPEN_PATHS:
            error = AuthenticationError(
                "Invalid or missing API key; send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'."
            )
            if scope["type"] == "websocket":
                await _refuse_socket(error, scope, receive, send)
            else:
                await reject(error, {"WWW-Authenticate": "Bearer"}, scope, receive, send)
            return
        if scope["type"] == "websocket":  # each message's size is the socket's own check
            await self.app(scope, receive, send)
            return
        if scope["method"] == "POST" and route_of(scope) == FILES_PATH:
            # An upload streams on to storage (apis/files/form.py caps it as it comes): never held here.
            declared = headers.get("content-length", "")
            if declared.isdigit() and int(declared) > settings.cap(scope):
                await reject(_too_large(settings.cap(scope)), {"Connection": "close"}, scope, receive, send)
                return
        elif scope["method"] in _BODY_METHODS:
            body = await _read_body(headers, receive, settings.cap(scope))
            if body is None:  # the client left
                return
            if isinstance(body, ServiceError):
                await reject(body, {"Connection": "close"}, scope, receive, send)
                return
            scope.setdefault("state", {})[BODY_KEY] = body  # handed on: the limits read it here
            receive = replay(body, receive)
        await self.app(scope, receive, send)


def _presented(headers: Headers) -> str | None:
    """The key presented, as an `Authorization` value: the header itself, or ``x-api-key``'s key."""
    key = headers.get("x-api-key")
    return headers.get("authorization") or (f"Bearer {key}" if key else None)


def anthropic_route(scope: Scope) -> bool:
    """A route of Anthropic's API (/v1/messages and below), whose errors are in Anthropic's shape."""
    route = route_of(scope)
    return route == ANTHROPIC_PATH or route.startswith(ANTHROPIC_PATH + "/")


def body_of(scope: Scope) -> bytes | None:
    """The body the guard read of a request (a POST, PUT or PATCH but an upload to /v1/files); None
    for any other request.
    """
    body = scope.get("state", {}).get(BODY_KEY)
    return body if isinstance(body, bytes) else None


def route_of(scope: Scope) -> str:
    """The request's path below the app's root path."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


async def _read_body(headers: Headers, receive: Receive, cap: int) -> bytes | ServiceError | None:
    """The whole body, or the 413 to send as soon as it is known to exceed `cap` bytes."""
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        return _too_large(cap)
    body = bytearray()
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if len(body) > cap:
            return _too_large(cap)
        more = message.get("more_body", False)
    return bytes(body)


def _too_large(cap: int) -> PayloadTooLargeError:
    return PayloadTooLargeError(f"Request body exceeds {cap} bytes.")


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the app the body already read, then defers to the real one."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def reject(error: ServiceError, headers: dict[str, Any], scope: Scope, receive: Receive, send: Send) -> None:
    """Answer `error` in the route's API shape (OpenAI's, or Anthropic's on /v1/messages), with `headers`."""
    body = error_body(error.message, error.type, param=error.param, code=error.code)
    if anthropic_route(scope):
        record_of(Request(scope).state).error = error.code or error.type  # the access log's reason, as elsewhere
        body = as_anthropic(error.status, body)
    await JSONResponse(body, status_code=error.status, headers=headers)(scope, receive, send)


async def _refuse_socket(error: ServiceError, scope: Scope, receive: Receive, send: Send) -> None:
    body = error_body(error.message, error.type, param=error.param, code=error.code)
    socket = WebSocket(scope, receive, send)
    if "websocket.http.response" in scope.get("extensions", {}):
        await socket.send_denial_response(
            JSONResponse(body, status_code=error.status, headers={"WWW-Authenticate": "Bearer"})
        )
    else:
        await socket.close(code=1008, reason=error.message[:120])

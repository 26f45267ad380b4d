"""The WebSocket mode of /v1/responses (OpenAI's): one connection, many turns, one at a time.

The client sends `response.create` messages (the create body and its `type`; no `stream`); each
is a turn, answered in order: the same semantic events as a streamed HTTP response, one JSON text
message each, ending with `response.completed` (or `incomplete`, or `error` then `response.failed`
when it fails after its first event). A turn that fails before its first event gets one message,
``{"type": "error", "status": <HTTP status>, "error": {"type", "code", "message", "param"}}``, and
the connection stays open for the next turn.

The connection remembers its most recent response (`store.ConnectionCache`), `store: false` or not:
the next turn continues it with `previous_response_id` and only its new input. Nothing outlives the
connection, so after a reconnect a `store: false` response is `previous_response_not_found`, and a
turn that fails forgets the response it continued (a stored one is still found in the store).

A connection lasts at most an hour (`LIFETIME_S`, as OpenAI's): once that has passed, the next wait
for a message ends it with a `websocket_connection_limit_reached` error and a normal close, so that
the client reconnects (an open connection is an ongoing request of its ingress replica, counted
by Serve against `max_ongoing_requests` and by autoscaling). A turn in progress is never cut.

A message larger than `server.max_body_bytes` is a 413 for its turn, as a request body is. Each turn
has its own access-log line and metrics (`method=WS`), and its deadline, as a request has. A client
that leaves cancels the turn's generation when its next event cannot be sent.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from deployments.errors import InvalidRequestError, PayloadTooLargeError, error_body
from deployments.ingress.answer.reply import Reply, recorded_error
from deployments.ingress.apis.responses.store import ConnectionCache
from deployments.monitoring.access_log import RequestRecord
from deployments.protocol.openai.responses import ResponseCreateEvent, ResponseRequest

LIFETIME_S = 3600.0

Turn = Callable[[ResponseRequest, RequestRecord, ConnectionCache, dict[str, Any]], Awaitable[Reply]]
"""A turn's answer: the Responses service's streamed create, on the connection's cache; its last
argument is the message as the client sent it (what the limits estimate, as they do a body)."""


class ResponseSocket:
    """One WebSocket connection of the Responses API: `run` serves its turns until the client leaves."""

    def __init__(
        self,
        websocket: WebSocket,
        turn: Turn,
        *,
        max_message_bytes: int,
        request_id: str,
        log: Callable[[RequestRecord], None],
        lifetime_s: float = LIFETIME_S,
    ) -> None:
        """`request_id`: the connection's (each turn's is it and the turn's number); `log`: writes a
        turn's access-log line and metrics; `lifetime_s`: how long the connection may last.
        """
        self._socket = websocket
        self._turn = turn
        self._max_bytes = max_message_bytes
        self._request_id = request_id
        self._log = log
        self._connection = ConnectionCache()
        self._lifetime_s = lifetime_s

    async def run(self) -> None:
        await self._socket.accept()
        ends = asyncio.get_running_loop().time() + self._lifetime_s
        turns = 0
        while True:
            try:
                async with asyncio.timeout_at(ends):
                    message = await self._socket.receive()
            except TimeoutError:
                await self._expire()
                return
            if message["type"] == "websocket.disconnect":
                return
            turns += 1
            record = RequestRecord(request_id=f"{self._request_id}-{turns}", method="WS", path=self._socket.url.path)
            try:
                text = message.get("text") or (message.get("bytes") or b"").decode(errors="replace")
                if not await self._answer(text, record):
                    return
            finally:
                self._log(record)

    async def _answer(self, text: str, record: RequestRecord) -> bool:
        """Answer one turn; False when the client has gone."""
        previous: object = None
        try:
            if len(text.encode()) > self._max_bytes:
                raise PayloadTooLargeError(f"Message exceeds {self._max_bytes} bytes.")
            data = _event(text)
            previous = data.get("previous_response_id")
            event = ResponseCreateEvent.model_validate(data)
            record.model = event.model
            reply = await self._turn(event.request(), record, self._connection, data)
        except Exception as exc:  # before the turn's first event: its error message
            self._connection.forget(previous if isinstance(previous, str) else None)
            status, body = recorded_error(exc, record)
            record.status = status
            error = body["error"]
            return await self._send(json.dumps({"type": "error", "status": status, "error": _coded(error)}))
        record.status = 200
        assert reply.events is not None  # a turn always streams
        async with aclosing(reply.events):  # type: ignore[type-var]
            async for frame in reply.events:
                if not await self._send(frame):
                    return False  # closing the events cancels the generation
        return True

    async def _expire(self) -> None:
        minutes = f"{self._lifetime_s / 60:g}"
        message = f"The connection reached its limit of {minutes} minutes; open a new one to go on."
        error = error_body(message, "invalid_request_error", code="websocket_connection_limit_reached")["error"]
        if await self._send(json.dumps({"type": "error", "status": 400, "error": error})):
            await self._socket.close(code=1000)

    async def _send(self, text: str) -> bool:
        try:
            await self._socket.send_text(text)
        except (WebSocketDisconnect, RuntimeError, OSError):
            return False
        return True


def _event(text: str) -> dict:
    """A client message as a `response.create` event's fields."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # nested too deeply is unreadable too: a 400, as over HTTP
        raise InvalidRequestError("The message is not valid JSON.") from None
    if not isinstance(data, dict):
        raise InvalidRequestError("The message must be a JSON object (a response.create event).")
    if data.get("type") != "response.create":
        raise InvalidRequestError(
            f"Unknown event type {data.get('type')!r}: this server takes response.create.", param="type"
        )
    return data


def _coded(error: dict) -> dict:
    """OpenAI's error body; WebSocket mode's always has a `code` (its type when it has none)."""
    return {**error, "code": error["code"] or error["type"]}


def connection_id() -> str:
    """A new id for a Responses WebSocket connection (``ws_`` and 16 hex digits)."""
    return f"ws_{secrets.token_hex(8)}"

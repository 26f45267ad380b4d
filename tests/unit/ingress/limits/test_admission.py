"""Admission through the real app (the limits middleware and a ledger in this process) where a
hostile client would look for a way around it: the keys of the key list each have their own bucket
of the default's size, a place among a key's concurrent requests is held until its response has
reached the client (not only until the app has queued it, as under Serve), a body nested too
deeply is the same 400 with a limits file as without one, and the limits read the body the guard
read (never the server's `receive` again)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

import httpx
from starlette.types import ASGIApp, Message

from deployments.config import ServerConfig
from deployments.config.limits import parse_limits
from deployments.ingress.api import build_api
from deployments.ingress.apis.counting import ROUTES
from deployments.ingress.guard import BODY_KEY, GuardSettings
from deployments.ingress.limits.limiter import KeyLimiter, Limiter
from deployments.ingress.limits.table import KeyTable
from tests.unit.fake_metrics import FakeMetrics
from tests.unit.ingress.fakes import FakeDecoder
from tests.unit.ingress.limits.test_limiter import LocalBoard, served_models

KEY_X, KEY_Y = "sk-listed-x-0123456789", "sk-listed-y-9876543210"
CHAT = "/v1/chat/completions"
BODY = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}


def app(text: str, board: LocalBoard, decoder: FakeDecoder | None = None, metrics: FakeMetrics | None = None):
    """The ingress's app with the key list X and Y, and the limits file `text` (no named key of theirs)."""
    served = served_models(decoder or FakeDecoder(["Hi"]))
    table = KeyTable(parse_limits(text, "limits.yaml"), None, environ={})
    guard = GuardSettings.from_config(ServerConfig(api_keys=[KEY_X, KEY_Y], api_keys_env=None), extra_keys=table)
    limiter = Limiter(table, board, served, {"echo": 64}, metrics or FakeMetrics(), routes=ROUTES)
    return build_api(served, guard, FakeMetrics(), limiter=limiter)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_each_listed_key_has_its_own_bucket_of_the_defaults_size():
    board, metrics = LocalBoard(), FakeMetrics()
    api = app("default: {requests_per_minute: 1}", board, metrics=metrics)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://test") as http:
        assert (await http.post(CHAT, json=BODY, headers=auth(KEY_X))).status_code == 200
        assert (await http.post(CHAT, json=BODY, headers=auth(KEY_X))).status_code == 429
        other = await http.post(CHAT, json=BODY, headers=auth(KEY_Y))  # never sent a request: its bucket is full
    assert other.status_code == 200 and other.headers["x-ratelimit-limit-requests"] == "1"
    assert metrics.count("key_requests", key="default") == 2  # the metrics name the entry: bounded label values
    table = KeyTable(parse_limits("default: {}", "limits.yaml"), None, environ={})
    x, y = (table.identify(hashlib.sha256(key.encode()).digest()) for key in (KEY_X, KEY_Y))
    assert x.bucket != y.bucket and len(x.bucket.partition(":")[2]) == 16  # 8 bytes of the key's digest
    assert table.named(x.name, x.queue).bucket == x.bucket  # a batch's lines count against its key's own bucket


class QueuedServer:
    """A server as Serve's replica is to the app: `send` only queues each message for the proxy to
    send on (it never waits for the client), and `receive` says `http.disconnect` once the client has
    read the response's last message (or has gone)."""

    def __init__(self, app: ASGIApp, body: dict[str, Any], key: str) -> None:
        self.messages: asyncio.Queue[Message] = asyncio.Queue()
        self.queued_whole = asyncio.Event()  # the app has queued its last message
        self._read_whole = asyncio.Event()
        data = json.dumps(body).encode()
        headers = [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": CHAT,
            "raw_path": CHAT.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [*headers, (b"content-length", str(len(data)).encode())],
            "client": ("127.0.0.1", 5000),
            "server": ("test", 80),
        }
        requested = False

        async def receive() -> Message:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": data, "more_body": False}
            await self._read_whole.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            self.messages.put_nowait(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.queued_whole.set()

        self.task = asyncio.create_task(app(scope, receive, send))

    async def read(self) -> Message:
        """The client reads the next message."""
        message = await self.messages.get()
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self._read_whole.set()
        return message

    async def read_all(self) -> tuple[int, bytes]:
        """The response's status and body (read from its start)."""
        start = await self.read()
        return start["status"], await self.read_rest()

    async def read_rest(self) -> bytes:
        body = b""
        while not self._read_whole.is_set():
            body += (await self.read()).get("body", b"")
        await self.task
        return body

    def leave(self) -> None:
        """The client goes away."""
        self._read_whole.set()


async def test_a_stream_holds_the_keys_place_until_its_client_has_read_it_whole():
    board = LocalBoard()
    api = app("default: {max_concurrent: 1}", board, FakeDecoder(["tick "] * 40))
    stream = QueuedServer(api, {**BODY, "stream": True, "max_tokens": 40}, KEY_X)
    start = await stream.read()
    role = await stream.read()
    assert start["status"] == 200 and b'"role": "assistant"' in role["body"]
    await stream.queued_whole.wait()  # the app has queued the whole stream; its client has read one event
    for _ in range(50):  # let the app's task run on to its end
        await asyncio.sleep(0)
    second = QueuedServer(api, BODY, KEY_X)
    status, body = await second.read_all()
    assert status == 429 and "concurrent" in json.loads(body)["error"]["message"]
    await stream.read_rest()  # read to its end: the place is free
    assert (await QueuedServer(api, BODY, KEY_X).read_all())[0] == 200
    assert board.ledger.in_flight("default:" + hashlib.sha256(KEY_X.encode()).digest()[:8].hex()) == 0


async def test_a_client_that_leaves_frees_its_place():
    board = LocalBoard()
    api = app("default: {max_concurrent: 1}", board, FakeDecoder(["tick "] * 40))
    stream = QueuedServer(api, {**BODY, "stream": True, "max_tokens": 40}, KEY_X)
    assert (await stream.read())["status"] == 200
    stream.leave()
    await stream.task
    assert (await QueuedServer(api, BODY, KEY_X).read_all())[0] == 200


async def test_a_body_nested_too_deeply_is_the_same_400_with_limits_as_without():
    deep = '{"model": "echo", "messages": [{"role": "user", "content": ' + "[" * 100_000 + "]" * 100_000 + "}]}"
    served = served_models(FakeDecoder(["Hi"]))
    plain = build_api(served, GuardSettings.from_config(ServerConfig(api_keys_env=None)), FakeMetrics())
    limited = app("default: {requests_per_minute: 100, tokens_per_minute: 100000}", LocalBoard())
    answers = []
    for api, headers in ((plain, {}), (limited, auth(KEY_X))):
        transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            for route in (CHAT, "/v1/responses", "/v1/embeddings", "/tokenize"):
                answers.append((route, (await http.post(route, content=deep, headers=headers)).status_code))
    assert answers[:4] == answers[4:] and {status for _, status in answers} == {400}


async def test_the_limits_admit_by_the_body_the_guard_handed_on_without_receiving_it_again():
    board, table = LocalBoard(), KeyTable(parse_limits("default: {requests_per_minute: 5}", "limits.yaml"), None, {})
    limiter = Limiter(table, board, served_models(FakeDecoder(["Hi"])), {"echo": 64}, FakeMetrics(), routes=ROUTES)
    events: list[str] = []

    async def route(scope, receive, send) -> None:
        events.append("route")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive() -> Message:  # the server's: the body was read from it by the guard already
        events.append("receive")
        return {"type": "http.disconnect"}

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    state = {BODY_KEY: json.dumps({**BODY, "model": "echo"}).encode()}
    scope = {"type": "http", "method": "POST", "path": CHAT, "headers": [], "state": state}
    await KeyLimiter(route, limiter)(scope, receive, send)
    assert events == ["route", "receive"]  # admitted first; then only the server's word that the response went
    assert dict(sent[0]["headers"])[b"x-ratelimit-remaining-requests"] == b"4"
    assert board.ledger.in_flight("default") == 0

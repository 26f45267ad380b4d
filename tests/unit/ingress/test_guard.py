"""The request guard (API keys, body cap, the body it hands on) on a small Starlette app, through
httpx's ASGI transport."""

from __future__ import annotations

import hashlib

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from deployments.config import ServerConfig
from deployments.ingress.guard import FILES_PATH, GuardSettings, KeyRing, RequestGuard, body_of

KEY = "sk-test-0123456789"


class FakeKeys:
    """Extra keys by their digests, which may change between requests (as a limits file's do)."""

    def __init__(self, *keys: str) -> None:
        self.digests = [hashlib.sha256(key.encode()).digest() for key in keys]


async def echo(request: Request) -> JSONResponse:
    body = await request.body()
    return JSONResponse({"bytes": len(body)})


async def handed_on(request: Request) -> JSONResponse:
    """What the guard handed on, read before the body (and then the body, read once more by the route)."""
    body = body_of(request.scope)
    return JSONResponse({"handed_on": None if body is None else body.decode(), "body": (await request.body()).decode()})


def client(keys: list[str] = (), max_body_bytes: int = 1000, extra_keys: FakeKeys | None = None) -> httpx.AsyncClient:
    routes = [Route("/v1/echo", echo, methods=["GET", "POST"]), Route("/health", echo)]
    routes += [Route(path, handed_on, methods=["GET", "POST", "DELETE"]) for path in ("/v1/seen", FILES_PATH)]
    settings = GuardSettings(KeyRing(list(keys)), max_body_bytes, extra_keys=extra_keys)
    guarded = RequestGuard(Starlette(routes=routes), settings=settings)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=guarded), base_url="http://test")


def assert_openai_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and "type" in error and "param" in error


async def test_open_without_keys() -> None:
    async with client() as c:
        assert (await c.post("/v1/echo", content=b"abc")).json() == {"bytes": 3}


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer wrong-key-000000", f"Basic {KEY}", KEY, f"Bearer {KEY}x", f"Bearer {KEY[:-1]}"],
)
async def test_keys_refuse_anything_but_the_bearer_key(authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization is not None else {}
    async with client([KEY]) as c:
        response = await c.post("/v1/echo", content=b"abc", headers=headers)
    assert_openai_error(response, 401, "invalid_api_key")
    assert response.headers["www-authenticate"] == "Bearer"
    assert KEY not in response.text


async def test_keys_accept_each_configured_key_and_leave_health_open() -> None:
    async with client([KEY, "sk-other-key-42"]) as c:
        for key in (KEY, "sk-other-key-42"):
            response = await c.post("/v1/echo", content=b"ab", headers={"Authorization": f"bearer {key}"})
            assert response.json() == {"bytes": 2}
        assert (await c.get("/health")).status_code == 200


async def test_body_over_the_cap_is_413_before_the_app_reads_it() -> None:
    async with client(max_body_bytes=100) as c:
        assert (await c.post("/v1/echo", content=b"x" * 100)).json() == {"bytes": 100}
        assert_openai_error(await c.post("/v1/echo", content=b"x" * 101), 413, "request_too_large")


async def test_chunked_body_without_length_is_counted_as_it_streams() -> None:
    async def chunks():
        for _ in range(20):
            yield b"y" * 10

    async with client(max_body_bytes=100) as c:
        response = await c.post("/v1/echo", content=chunks())
    assert "content-length" not in response.request.headers
    assert_openai_error(response, 413, "request_too_large")


async def test_lying_content_length_does_not_bypass_the_cap() -> None:
    async def chunks():
        yield b"z" * 80
        yield b"z" * 80

    async with client(max_body_bytes=100) as c:
        response = await c.post("/v1/echo", content=chunks(), headers={"Content-Length": "10"})
    assert_openai_error(response, 413, "request_too_large")


def test_keys_from_config_and_environment() -> None:
    server = ServerConfig(api_keys=[KEY], api_keys_env="TEST_KEYS")
    settings = GuardSettings.from_config(server, {"TEST_KEYS": " sk-env-key-0001 , ,sk-env-key-0002"})
    assert len(settings.keys) == 3
    assert settings.keys.accepts("Bearer sk-env-key-0002") and settings.keys.accepts(f"Bearer {KEY}")
    assert not GuardSettings.from_config(ServerConfig(), {}).keys  # open by default


async def test_the_body_read_is_handed_on_in_the_requests_state_and_replayed() -> None:
    async with client() as c:
        posted = await c.post("/v1/seen", content=b'{"model": "m"}')
        got, deleted = await c.get("/v1/seen"), await c.delete("/v1/seen")
        upload = await c.post(FILES_PATH, content=b"streamed on, not held")
    assert posted.json() == {"handed_on": '{"model": "m"}', "body": '{"model": "m"}'}
    assert got.json()["handed_on"] is None and deleted.json()["handed_on"] is None  # no body read
    assert upload.json() == {"handed_on": None, "body": "streamed on, not held"}  # an upload is never held


async def test_extra_keys_are_accepted_as_they_are_at_each_request() -> None:
    extra = FakeKeys()
    async with client([KEY], extra_keys=extra) as c:
        assert (await c.post("/v1/echo", headers={"Authorization": "Bearer sk-named-1"})).status_code == 401
        extra.digests = FakeKeys("sk-named-1").digests  # the limits file was edited
        assert (await c.post("/v1/echo", headers={"Authorization": "Bearer sk-named-1"})).status_code == 200
        assert (await c.post("/v1/echo", headers={"Authorization": f"Bearer {KEY}"})).status_code == 200


async def test_extra_keys_alone_make_keys_required() -> None:
    async with client(extra_keys=FakeKeys("sk-named-2")) as c:
        assert (await c.post("/v1/echo", content=b"a")).status_code == 401
        assert (await c.post("/v1/echo", headers={"x-api-key": "sk-named-2"})).status_code == 200

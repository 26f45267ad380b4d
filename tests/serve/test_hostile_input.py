"""Hostile input against the real service over HTTP, table-driven.

Each case checks the status code and the OpenAI error body (and `param`/`code` where they say
what went wrong), then that a normal request still succeeds. The service runs the tiny real LLM
(real tokenizer, real context check) and the tiny real VLM captioner, with API keys required and
tight limits so that every limit is reachable with small requests. Afterwards, the logs are
searched for the key and for image bytes.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
from PIL import Image

from tests.conftest import data_url, png_bytes
from tests.serve.conftest import BASE_URL, PORT, deploy, undeploy, write_models

MODEL = "tiny"
KEY = "sk-hostile-suite-4d1f9e"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_BODY = 256 * 1024
MAX_IMAGE_BYTES = 64 * 1024
# A valid image: its base64 must never appear in a log.
SECRET_IMAGE = data_url(png_bytes((13, 37, 42), size=(40, 40)))
# models.yaml's file-level sections: keys required, and tight limits that small requests reach.
LIMITS: dict[str, Any] = {
    "server": {"api_keys": [KEY], "max_body_bytes": MAX_BODY},
    "images": {
        "max_image_bytes": MAX_IMAGE_BYTES,
        "max_image_pixels": 1_000_000,
        "max_images_per_message": 2,
        "max_images_per_request": 3,
        "connect_timeout_s": 2,
        "total_timeout_s": 3,
    },
}


@pytest.fixture(scope="module")
def service(serve_cluster, tmp_path_factory, tiny_llm_dir, tiny_vlm_dir):
    models = write_models(
        tmp_path_factory.mktemp("hostile"),
        [
            {
                "name": MODEL,
                "local_path": str(tiny_llm_dir),
                "params": {"max_tokens": 4, "max_num_seqs": 4, "temperature": 0},
                "capabilities": {"vision_mode": "proxy", "captioner": "tiny-vlm"},
            },
            {"name": "tiny-vlm", "local_path": str(tiny_vlm_dir), "captioning": {"max_new_tokens": 4}},
        ],
        **LIMITS,
    )
    deploy(models)
    yield
    undeploy("default", "vision")


@pytest.fixture
def http() -> httpx.Client:
    with httpx.Client(base_url=BASE_URL, timeout=60) as client:
        yield client


def user(content: Any) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}]}


def image(url: Any) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def encoded(fmt: str, size: tuple[int, int] = (8, 8)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (1, 2, 3)).save(buf, format=fmt)
    return buf.getvalue()


def pixel_bomb() -> bytes:
    """A 60-byte PNG whose header claims 30000 x 30000 pixels: refused from the header alone."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 30_000, 30_000, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


@dataclass
class Case:
    name: str
    body: Any = None  # JSON body; `raw` wins when set
    status: int = 400
    code: str | None = None
    param: str | None = None
    raw: bytes | None = None
    method: str = "POST"
    path: str = "/v1/chat/completions"
    headers: dict[str, str] = field(default_factory=lambda: dict(AUTH))


HI = [{"role": "user", "content": "hi"}]
CASES = [
    # --- transport, access and framing
    Case("malformed json", raw=b'{"model": "tiny", "messages": [', param=None),
    Case("not utf-8", raw=b'{"model": "\xff\xfe"}'),
    Case("top-level array", raw=b"[1, 2, 3]"),
    Case("empty body", raw=b""),
    Case("deeply nested json", raw=b'{"model": "tiny", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    Case("body over the cap", raw=b'{"model": "' + b"a" * MAX_BODY + b'"}', status=413, code="request_too_large"),
    Case("no api key", {"model": MODEL, "messages": HI}, status=401, code="invalid_api_key", headers={}),
    Case(
        "wrong api key",
        {"model": MODEL, "messages": HI},
        status=401,
        code="invalid_api_key",
        headers={"Authorization": "Bearer sk-hostile-suite-4d1f9f"},
    ),
    Case("key in the wrong scheme", {"model": MODEL, "messages": HI}, 401, headers={"Authorization": f"Basic {KEY}"}),
    Case("unknown route", None, 404, method="GET", path="/v1/completions/../../etc/passwd"),
    Case("wrong method", None, 405, method="GET"),
    # --- schema
    Case("missing model", {"messages": HI}, param="model"),
    Case("missing messages", {"model": MODEL}, param="messages"),
    Case("empty messages", {"model": MODEL, "messages": []}, param="messages"),
    Case("messages is an object", {"model": MODEL, "messages": {"role": "user"}}, param="messages"),
    Case("unknown model", {"model": "gpt-9", "messages": HI}, 404, code="model_not_found", param="model"),
    Case("unknown role", {"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, param="messages[0].role"),
    Case("tool message without its call id", {"model": MODEL, "messages": [{"role": "tool", "content": "hi"}]}),
    Case("content is a number", user(42), param="messages[0].content"),
    Case("unknown part type", user([{"type": "input_audio", "input_audio": {}}]), param="messages[0].content[0].type"),
    Case("image_url as bare string", user([{"type": "image_url", "image_url": "data:x"}])),
    Case("image_url without url", user([{"type": "image_url", "image_url": {}}])),
    Case("image in a system message", {"model": MODEL, "messages": [{"role": "system", "content": [image("x")]}]}),
    Case("unknown field", {"model": MODEL, "messages": HI, "frobnicate": 1}, param="frobnicate"),
    Case("an OpenAI field we do not implement", {"model": MODEL, "messages": HI, "audio": {}}, param="audio"),
    Case("tools not a list", {"model": MODEL, "messages": HI, "tools": "calc"}, param="tools"),
    Case(
        "tool with a bad name",
        {"model": MODEL, "messages": HI, "tools": [{"type": "function", "function": {"name": "a b"}}]},
        param="tools",
    ),
    Case("tool_choice without tools", {"model": MODEL, "messages": HI, "tool_choice": "required"}, param="tool_choice"),
    Case(
        "top_logprobs above 20",
        {"model": MODEL, "messages": HI, "logprobs": True, "top_logprobs": 21},
        param="top_logprobs",
    ),
    Case("logit_bias out of range", {"model": MODEL, "messages": HI, "logit_bias": {"1": 101}}, param="logit_bias"),
    Case("logit_bias not token ids", {"model": MODEL, "messages": HI, "logit_bias": {"a": 1}}, param="logit_bias"),
    Case(
        "response_format unknown type",
        {"model": MODEL, "messages": HI, "response_format": {"type": "xml"}},
        param="response_format",
    ),
    Case(
        "stream_options without stream",
        {"model": MODEL, "messages": HI, "stream_options": {"include_usage": True}},
        param="stream_options",
    ),
    Case("completions without prompt", {"model": MODEL}, path="/v1/completions", param="prompt"),
    Case("completions empty prompt", {"model": MODEL, "prompt": ""}, path="/v1/completions", param="prompt"),
    Case("completions prompt of floats", {"model": MODEL, "prompt": [1.5]}, path="/v1/completions", param="prompt"),
    Case("completions suffix", {"model": MODEL, "prompt": "a", "suffix": "b"}, path="/v1/completions", param="suffix"),
    Case(
        "completions unknown model",
        {"model": "gpt-9", "prompt": "a"},
        404,
        code="model_not_found",
        path="/v1/completions",
    ),
    Case("model card of an unknown model", None, 404, code="model_not_found", method="GET", path="/v1/models/gpt-9"),
    Case("temperature out of range", {"model": MODEL, "messages": HI, "temperature": 5}, param="temperature"),
    Case("top_p zero", {"model": MODEL, "messages": HI, "top_p": 0}, param="top_p"),
    Case("max_tokens negative", {"model": MODEL, "messages": HI, "max_tokens": -1}, param="max_tokens"),
    Case("max_tokens a string", {"model": MODEL, "messages": HI, "max_tokens": "many"}, param="max_tokens"),
    Case("n above the server's maximum", {"model": MODEL, "messages": HI, "n": 9}, param="n"),
    Case("five stop strings", {"model": MODEL, "messages": HI, "stop": list("abcde")}, param="stop"),
    Case("empty stop string", {"model": MODEL, "messages": HI, "stop": [""]}, param="stop"),
    Case("stream_options wrong type", {"model": MODEL, "messages": HI, "stream_options": 3}, param="stream_options"),
    Case(
        "context overflow",
        {"model": MODEL, "messages": [{"role": "user", "content": "word " * 2000}]},
        code="context_length_exceeded",
    ),
    # --- images
    Case("data url not base64", user([image("data:image/png,rawbytes")]), code="invalid_image"),
    Case("data url bad base64", user([image("data:image/png;base64,@@@@")]), code="invalid_image"),
    Case("data url not an image mime", user([image("data:text/plain;base64,aGk=")]), code="invalid_image"),
    Case(
        "data url of text",
        user([image("data:image/png;base64," + base64.b64encode(b"hello").decode())]),
        code="invalid_image",
        param="messages[0].content[0].image_url",
    ),
    Case("bmp format", user([image(data_url(encoded("BMP"), "image/bmp"))]), code="invalid_image"),
    Case("truncated png", user([image(data_url(png_bytes()[:40]))]), code="invalid_image"),
    Case("pixel bomb", user([image(data_url(pixel_bomb()))]), code="invalid_image"),
    Case("image over the byte cap", user([image(data_url(b"\x89PNG" + b"0" * MAX_IMAGE_BYTES))]), code="invalid_image"),
    Case("ftp url", user([image("ftp://example.com/a.png")]), code="invalid_image"),
    Case("javascript url", user([image("javascript:alert(1)")]), code="invalid_image"),
    Case("file url without a file root", user([image("file:///etc/passwd")]), code="invalid_image"),
    Case("ssrf loopback", user([image(f"http://127.0.0.1:{PORT}/health")]), code="invalid_image"),
    Case("ssrf localhost name", user([image(f"http://localhost:{PORT}/health")]), code="invalid_image"),
    Case("ssrf metadata", user([image("http://169.254.169.254/latest/meta-data/")]), code="invalid_image"),
    Case("ssrf ipv6 loopback", user([image(f"http://[::1]:{PORT}/")]), code="invalid_image"),
    Case("ssrf private", user([image("http://10.0.0.1/a.png")]), code="invalid_image"),
    Case("ssrf decimal ip", user([image(f"http://2130706433:{PORT}/")]), code="invalid_image"),
    Case("too many images in a message", user([image(SECRET_IMAGE)] * 3), param="messages[0].content"),
    Case(
        "too many images in the request",
        {"model": MODEL, "messages": [{"role": "user", "content": [image(SECRET_IMAGE)] * 2}] * 2},
        param="messages",
    ),
]


def assert_openai_error(response: httpx.Response, case: Case) -> None:
    assert response.status_code == case.status, (case.name, response.status_code, response.text[:300])
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
    if case.code is not None:
        assert error["code"] == case.code, error
    if case.param is not None:
        assert (error["param"] or "").startswith(case.param), error


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_request_gets_a_clear_error_and_the_service_stays_up(service, http, case):
    content = case.raw if case.raw is not None else None
    response = http.request(
        case.method,
        case.path,
        content=content,
        json=case.body if content is None and case.body is not None else None,
        headers={"content-type": "application/json", **case.headers},
    )
    assert_openai_error(response, case)
    normal = http.post("/v1/chat/completions", json={"model": MODEL, "messages": HI}, headers=AUTH)
    assert normal.status_code == 200, normal.text
    assert normal.json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_valid_image_request_with_the_key_succeeds(service, http):
    response = http.post("/v1/chat/completions", json=user([image(SECRET_IMAGE)]), headers=AUTH)
    assert response.status_code == 200, response.text
    assert "x-vision-degraded" not in response.headers


def test_health_is_open_without_a_key(service, http):
    assert http.get("/health").status_code == 200
    assert http.get("/v1/models").status_code == 401
    assert http.get("/v1/models", headers=AUTH).json()["data"][0]["id"] == MODEL


def test_the_websocket_mode_needs_the_key_and_answers_hostile_messages(service):
    """/v1/responses over a WebSocket through Serve's proxy: a handshake without the key is a 401;
    with it, a message that is not JSON or is over the body cap gets its error, and the connection
    goes on to answer a turn."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    url = f"ws://127.0.0.1:{PORT}/v1/responses"
    with pytest.raises(InvalidStatus) as refused, connect(url, open_timeout=60):
        pass
    assert refused.value.response.status_code == 401
    with connect(url, additional_headers=AUTH, open_timeout=60, max_size=None) as socket:
        errors = []
        for message in ("not json", json.dumps({"type": "response.create", "input": "x" * MAX_BODY})):
            socket.send(message)
            errors.append(json.loads(socket.recv(timeout=60)))
        assert [(e["type"], e["status"], e["error"]["code"]) for e in errors] == [
            ("error", 400, "invalid_request_error"),
            ("error", 413, "request_too_large"),
        ]
        socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "hi"}))
        events = [json.loads(socket.recv(timeout=120))]
        while events[-1]["type"] not in ("response.completed", "response.incomplete", "response.failed", "error"):
            events.append(json.loads(socket.recv(timeout=120)))
    assert events[-1]["type"] in ("response.completed", "response.incomplete"), events[-1]


def test_logs_hold_no_key_and_no_image_bytes(service, http):
    """After the whole suite (bad and good image requests, wrong and right keys), no log file of
    the session contains the API key or a run of the image's base64."""
    needles = [KEY, SECRET_IMAGE.split(",", 1)[1][20:80], "sk-hostile-suite-4d1f9f"]
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
    files = [p for p in logs.rglob("*") if p.is_file()]
    assert len(files) > 5
    for path in files:
        text = path.read_bytes().decode(errors="replace")
        for needle in needles:
            assert needle not in text, f"{needle[:12]}... found in {path}"

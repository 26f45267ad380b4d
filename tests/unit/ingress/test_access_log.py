"""The access-log line and the ingress metrics (`monitoring.access_log.AccessLog`) over the real
FastAPI app with fake handles: one line per request with its fields, streamed or not, and the
counters each kind of request moves."""

from __future__ import annotations

import logging

import pytest

from deployments.monitoring.access_log import RequestRecord
from tests.conftest import data_url, png_bytes
from tests.unit.fake_metrics import FakeMetrics
from tests.unit.ingress.fakes import FakeCaptioner, FakeDecoder
from tests.unit.ingress.test_api import BODY, KEY, client

CHAT = "/v1/chat/completions"


def access_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "ray.serve" and r.getMessage().startswith("access ")]


def fields_of(record: logging.LogRecord) -> dict[str, str]:
    return dict(item.split("=", 1) for item in record.getMessage().removeprefix("access ").split(" "))


def image_body(text: str = "what is it?") -> dict:
    content = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": data_url(png_bytes())}}]
    return {"model": "echo", "messages": [{"role": "user", "content": content}]}


async def test_one_line_per_request_with_its_fields(caplog):
    caplog.set_level(logging.INFO, logger="ray.serve")
    async with client(FakeDecoder(["Hi", "!"])) as http:
        await http.post(CHAT, json=BODY, headers={"x-request-id": "req-1"})
        await http.post(CHAT, json={**BODY, "stream": True}, headers={"x-request-id": "req-2"})
    lines = access_lines(caplog)
    assert len(lines) == 2
    plain, streamed = (fields_of(r) for r in lines)
    assert plain["request_id"] == "req-1" and streamed["request_id"] == "req-2"
    for fields in (plain, streamed):
        assert (fields["model"], fields["path"], fields["status"], fields["method"]) == ("echo", CHAT, "200", "POST")
        assert int(fields["prompt_tokens"]) > 0 and int(fields["completion_tokens"]) == 2
        assert 0 <= float(fields["ttft_s"]) <= float(fields["duration_s"])
        assert (fields["images"], fields["cache_hits"], fields["degraded"], fields["error"]) == ("0", "0", "-", "-")
    # The same fields for the JSON encoding (Serve adds request_id itself)
    extra = lines[0].__dict__["ray_serve_extra_fields"]
    assert extra["model"] == "echo" and extra["completion_tokens"] == 2 and "request_id" not in extra


async def test_images_cache_hits_and_degradation_are_logged_and_counted(caplog):
    caplog.set_level(logging.INFO, logger="ray.serve")
    metrics, captioner = FakeMetrics(), FakeCaptioner()
    async with client(FakeDecoder(), captioner=captioner, metrics=metrics) as http:
        assert (await http.post(CHAT, json=image_body())).status_code == 200
        assert (await http.post(CHAT, json=image_body())).status_code == 200  # the same image: a cache hit
        captioner.down = True
        assert (await http.post(CHAT, json=image_body("again?"))).status_code == 200  # degraded
    first, second, third = (fields_of(r) for r in access_lines(caplog))
    assert (first["images"], first["cache_hits"]) == ("1", "0")
    assert (second["images"], second["cache_hits"]) == ("1", "1")
    assert third["degraded"] == "captioner_unavailable"
    assert metrics.count("caption_cache_hits") == 1 and metrics.count("caption_cache_misses") == 2
    assert metrics.count("requests_degraded", reason="captioner_unavailable") == 1
    assert metrics.count("image_bytes") == 3 * len(png_bytes())
    assert metrics.count("image_pixels") > 0
    assert metrics.count("http_requests", route=CHAT, status="200") == 3


async def test_rejections_are_counted_by_status_and_reason_even_before_a_route(caplog):
    caplog.set_level(logging.INFO, logger="ray.serve")
    metrics = FakeMetrics()
    async with client(FakeDecoder(), keys=[KEY], metrics=metrics) as http:
        assert (await http.post(CHAT, json=BODY)).status_code == 401  # the guard, before any route
        auth = {"Authorization": f"Bearer {KEY}"}
        assert (await http.post(CHAT, json={**BODY, "model": "gpt-9"}, headers=auth)).status_code == 404
        assert (await http.post(CHAT, json={**BODY, "temperature": 9}, headers=auth)).status_code == 400
        assert (await http.get("/no/such/path", headers=auth)).status_code == 404
    assert metrics.count("requests_rejected", status="401", reason="invalid_api_key") == 1
    assert metrics.count("requests_rejected", status="404", reason="model_not_found") == 1
    assert metrics.count("requests_rejected", status="400", reason="invalid_request_error") == 1
    assert metrics.count("http_requests", route=CHAT, status="401") == 1
    assert metrics.count("http_requests", route="unmatched", status="404") == 1
    assert [fields_of(r)["error"] for r in access_lines(caplog)] == [
        "invalid_api_key",
        "model_not_found",
        "invalid_request_error",
        "not_found",
    ]


async def test_an_error_after_the_first_byte_is_counted_with_its_own_status():
    metrics = FakeMetrics()
    decoder = FakeDecoder(["a", "b", "c"], error=RuntimeError("boom"))
    decoder.fail_at = 2
    async with client(decoder, metrics=metrics) as http:
        reply = await http.post(CHAT, json={**BODY, "stream": True})
    assert reply.status_code == 200 and '"error"' in reply.text
    assert metrics.count("requests_rejected", status="500", reason="server_error") == 1


def test_a_record_outside_the_middleware_is_detached():
    record = RequestRecord()
    record.first_token()
    assert record.ttft_s is not None and record.fields(1.0)["duration_s"] == 1.0

"""Overload, deadlines and component faults with real Ray Serve.

Deployed the way `serve run serve_config.yaml` deploys, from a declarative config that overrides
the builder's queue bounds, with the shipped fake decoder made slow (`engine: fake`, 20 ms per
token, echoing the prompt then ticking up to max_tokens, its live generations on /health) so that
requests are reliably in flight when a queue fills, a deadline passes or the decoder replica is
killed. (The captioner killed under traffic: test_proxy_vision.)
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from ray import serve
from ray.serve._private.api import serve_start
from ray.serve.schema import ServeDeploySchema

from deployments.protocol.replica import GenerateRequest, TextMessage
from tests.serve.conftest import BASE_URL, kill_replicas, undeploy, wait_until, write_models

DEADLINE_S = 6.0
# One slot above max_num_seqs (2), so /health's status call gets through while both generate.
QUEUE = {"max_ongoing_requests": 3, "max_queued_requests": 1, "backpressure_config": {"retry_after_s": 1}}


@pytest.fixture(scope="module")
def service(serve_cluster, tmp_path_factory):
    models = write_models(
        tmp_path_factory.mktemp("reliability"),
        [
            {
                "name": "slow",
                "engine": "fake",
                "fake": {"token_delay_ms": 20, "fill_to_max_tokens": True},
                "params": {"max_tokens": 4, "max_num_seqs": 2},
                "capabilities": {"vision_mode": "proxy", "captioner": "cap"},
            },
            {"name": "cap", "engine": "fake"},
        ],
        server={"request_timeout_s": DEADLINE_S},
        proxy_vision={"timeout_s": 5},
    )
    # One decoder replica, never scaled: the queue bounds below are per replica.
    args = {"models_file": str(models), "decoder_gpus": 0, "decoder_cpu_replicas": 1}
    config = {
        "applications": [
            {
                "name": "vision",
                "route_prefix": None,
                "import_path": "deployments.app:build_captioner_app",
                "args": args,
            },
            {
                "name": "default",
                "route_prefix": "/",
                "import_path": "deployments.app:build_app",
                "args": args,
                "deployments": [{"name": "PrimaryDecoder", **QUEUE}],
            },
        ]
    }
    serve_start().deploy_apps(ServeDeploySchema.model_validate(config), _blocking=True)
    yield models
    undeploy("default", "vision")


@pytest.fixture
def http() -> httpx.Client:
    with httpx.Client(base_url=BASE_URL, timeout=60) as client:
        yield client


def chat(text: str = "hello", max_tokens: int = 4, stream: bool = False) -> dict:
    return {
        "model": "slow",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def running(http: httpx.Client) -> int:
    return http.get("/health").json()["components"]["decoder"]["details"]["running"]


def assert_normal_request_works(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json=chat("still fine?"))
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"].startswith("user: still fine?")


def sse_events(response: httpx.Response) -> list[str]:
    return [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]


def test_a_stop_still_open_when_generation_ends_is_cut_with_finish_stop(service, http):
    """Until generation ends, "abc" could become the stop "abcd"; then the stop "bc" inside it is
    the first one: the text is cut there and the finish reason is "stop", not the engine's "length"
    (the engine's three tokens are "user:", " say", " abc")."""
    body = {**chat("say abc", max_tokens=3), "stop": ["abcd", "bc"]}
    choice = http.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("user: say a", "stop")


def test_full_decoder_queue_is_503_with_retry_after(service, http):
    """2 generating + 1 waiting in the replica + 1 queued fit; the rest are turned away at once
    instead of waiting. (Serve counts a request as queued until a replica takes it, so a burst can
    be turned away below the bound.) Each takes 1.2 s, so a fourth that was let in ends by about
    3.6 s, well inside the deadline (at 2 s each it ended at the deadline itself: a 408)."""
    long = chat("long", max_tokens=60)  # 1.2 s each
    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(lambda _: http.post("/v1/chat/completions", json=long), range(6)))
    statuses = sorted(r.status_code for r in responses)
    assert 200 in statuses and 503 in statuses and set(statuses) == {200, 503}, statuses
    for r in responses:
        if r.status_code == 503:
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"]["code"] == "overloaded"
    assert_normal_request_works(http)


def test_deadline_is_408_and_cancels_the_generation(service, http):
    started = time.monotonic()
    response = http.post("/v1/chat/completions", json=chat(max_tokens=10_000))  # 200 s of ticks
    assert response.status_code == 408
    assert response.json()["error"]["code"] == "request_timeout"
    assert time.monotonic() - started < DEADLINE_S + 10
    assert wait_until(lambda: running(http) == 0, timeout_s=5)  # the decoder stopped generating
    assert_normal_request_works(http)


def test_deadline_mid_stream_ends_with_an_error_event(service, http):
    with http.stream("POST", "/v1/chat/completions", json=chat(max_tokens=10_000, stream=True)) as response:
        assert response.status_code == 200
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "request_timeout"
    assert wait_until(lambda: running(http) == 0, timeout_s=5)


def test_health_falls_back_to_serves_view_when_the_decoder_is_saturated(service, http):
    """With every slot of the replica taken (max_ongoing_requests 3), /health's status call waits
    behind generation; /health then answers from Serve's health checks, not "unreachable"."""
    decoder = serve.get_deployment_handle("PrimaryDecoder", app_name="default").options(stream=True)
    request = GenerateRequest(messages=[TextMessage(role="user", content="busy")], max_tokens=2000)  # 40 s
    streams = []  # straight to the decoder: no ingress deadline on this path
    try:
        for n in (1, 2):  # one by one: a burst would be turned away by the queue bound of 1
            streams.append(decoder.generate.remote(request))
            assert wait_until(lambda n=n: running(http) == n, timeout_s=10)
        streams.append(decoder.generate.remote(request))  # waits for a sequence slot: the replica is full
        assert wait_until(lambda: "busy" in http.get("/health").json()["components"]["decoder"]["details"], 20)
        health = http.get("/health")
        assert health.status_code == 200
        assert "Serve reports PrimaryDecoder HEALTHY" in health.json()["components"]["decoder"]["details"]["busy"]
    finally:
        for stream in streams:
            stream.cancel()
    assert wait_until(lambda: running(http) == 0, timeout_s=10)


def test_decoder_killed_mid_request_gives_clean_errors_then_recovers(service, http):
    """In-flight requests end at once with a 503 or an error event (no hang); Serve restarts the
    replica and new requests succeed."""

    def streamed() -> list[str]:
        with http.stream("POST", "/v1/chat/completions", json=chat(max_tokens=1000, stream=True)) as response:
            return sse_events(response)

    with ThreadPoolExecutor(2) as pool:
        started = time.monotonic()
        # No /health polling while a request is being admitted: with a queue of 1, a status call
        # arriving at the same moment can turn the request away (503 overloaded).
        plain = pool.submit(http.post, "/v1/chat/completions", json=chat(max_tokens=1000))
        time.sleep(0.5)
        assert wait_until(lambda: running(http) == 1, timeout_s=2, every_s=0.05)
        stream = pool.submit(streamed)
        time.sleep(0.5)
        assert wait_until(lambda: running(http) == 2, timeout_s=2, every_s=0.05)
        kill_replicas("PrimaryDecoder")
        response, events = plain.result(timeout=30), stream.result(timeout=30)
    assert time.monotonic() - started < DEADLINE_S  # they ended on the kill, not on the deadline
    assert response.status_code == 503, response.text
    assert response.json()["error"]["type"] == "service_unavailable"
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["type"] == "service_unavailable"
    assert wait_until(lambda: http.post("/v1/chat/completions", json=chat("back?")).status_code == 200, timeout_s=90)

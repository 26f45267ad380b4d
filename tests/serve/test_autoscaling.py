"""Autoscaling from models.yaml (`deployment.autoscaling`), watched through Serve's controller.

- The decoder, on a fake GPU, with a slow fake engine and short delays: sustained load takes it
  from min to max replicas, a light load brings it back to min, and no request fails during either
  move.
- The captioner at `min_replicas: 0`: idle it has no replica, and /health polls do not start one; an
  image request starts one and waits for it within `proxy_vision.timeout_s` (captioned), or, with a
  timeout shorter than the cold start, degrades at the timeout (the replica still comes up, and the
  next request after `retry_after_s` is captioned); idle again, it goes back to zero.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from ray import serve

from deployments.app import build_app, build_captioner_app
from tests.conftest import data_url, png_bytes
from tests.serve.conftest import BASE_URL, image_chat, undeploy, wait_until, write_models

FAST = {"upscale_delay_s": 1, "downscale_delay_s": 2, "look_back_period_s": 2, "metrics_interval_s": 0.5}


def replicas(app: str, deployment: str) -> dict[str, int]:
    """Serve's replica states of one deployment, e.g. {"RUNNING": 2, "STARTING": 1}."""
    states = serve.status().applications[app].deployments[deployment].replica_states
    return {str(getattr(state, "value", state)): count for state, count in states.items() if count}


# --- the decoder: min -> max -> min -------------------------------------------------------------


@dataclass
class Reply:
    started: float
    ended: float
    status: int
    finish: str | None


@dataclass
class Load:
    """`workers` threads, of which the first `concurrency` send chat requests back to back."""

    url: str
    body: dict[str, Any]
    workers: int
    concurrency: int = 0
    replies: list[Reply] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(self.workers)]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _work(self, index: int) -> None:
        with httpx.Client(base_url=BASE_URL, timeout=60) as client:
            while not self._stop.is_set():
                if index >= self.concurrency:
                    time.sleep(0.05)
                    continue
                started = time.monotonic()
                try:
                    response = client.post(self.url, json=self.body)
                    finish = response.json()["choices"][0]["finish_reason"] if response.status_code == 200 else None
                    status = response.status_code
                except Exception:  # a dropped connection counts as a failed request
                    finish, status = None, 0
                self.replies.append(Reply(started, time.monotonic(), status, finish))


@dataclass
class Timeline:
    """Samples of the decoder's replica states, taken every 0.25 s by a thread."""

    app: str
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Timeline:
        threading.Thread(target=self._sample, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), replicas(self.app, "PrimaryDecoder")))
            time.sleep(0.25)

    def now(self) -> dict[str, int]:
        return self.samples[-1][1] if self.samples else {}

    def move(self, before: dict[str, int], after: dict[str, int]) -> tuple[float, float]:
        """From the last sample at `before` to the first at `after` that follows it."""
        last_before = None
        for t, states in self.samples:
            if states == before:
                last_before = t
            elif states == after and last_before is not None:
                return last_before, t
        raise AssertionError(f"no move from {before} to {after}: {self.samples}")


@pytest.fixture(scope="module")
def decoders(serve_cluster, tmp_path_factory):
    """A slow fake decoder on half a fake GPU per replica: a request is 24 tokens of 40 ms (about
    1 s); a replica holds 2 requests, and Serve aims at 2 per replica."""
    slow = {
        "name": "slow",
        "engine": "fake",
        "params": {"max_num_seqs": 2, "max_tokens": 24, "stream_interval_ms": 100},
        "fake": {"token_delay_ms": 40, "fill_to_max_tokens": True},
        "deployment": {
            "max_ongoing_requests": 2,
            "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 2, **FAST},
        },
    }
    models = write_models(tmp_path_factory.mktemp("scale"), [slow])
    serve.run(build_app({"models_file": str(models), "decoder_gpus": 0.5}), name="scale", route_prefix="/scale")
    yield
    undeploy("scale")


def test_the_decoder_scales_from_min_to_max_and_back_without_a_failed_request(decoders):
    body = {"model": "slow", "messages": [{"role": "user", "content": "go"}]}
    load = Load("/scale/v1/chat/completions", body, workers=6)
    assert replicas("scale", "PrimaryDecoder") == {"RUNNING": 1}
    with Timeline("scale") as timeline:
        load.start()
        try:
            began = time.monotonic()
            load.concurrency = 6  # 3 requests per replica at 2 replicas, 6 at 1: Serve wants 2 (its max)
            assert wait_until(lambda: timeline.now() == {"RUNNING": 2}, timeout_s=40, every_s=0.25), timeline.samples
            reached_max = time.monotonic() - began
            time.sleep(2)  # both replicas serve the load
            dropped = time.monotonic()
            load.concurrency = 1  # half a replica's target: Serve wants 1
            assert wait_until(lambda: timeline.now() == {"RUNNING": 1}, timeout_s=40, every_s=0.25), timeline.samples
            reached_min = time.monotonic() - dropped
            time.sleep(1)
        finally:
            load.concurrency = 0
            load.stop()
    up = timeline.move({"RUNNING": 1}, {"RUNNING": 2})
    down = timeline.move({"RUNNING": 2}, {"RUNNING": 1})
    failed = [r for r in load.replies if r.status != 200 or r.finish != "length"]
    assert not failed, failed
    for start, end in (up, down):  # requests were in flight while replicas were added and removed
        assert any(r.started < end and r.ended > start for r in load.replies), (start, end)
    moves = f"max {reached_max:.1f}s after the load rose (replica start {up[1] - up[0]:.1f}s), "
    moves += f"min {reached_min:.1f}s after it fell (replica stop {down[1] - down[0]:.1f}s)"
    print(f"\n{moves}, {len(load.replies)} requests, none failed")


# --- the captioner: scale to zero ---------------------------------------------------------------

# 5 s at one idle replica before zero: room for the next request after retry_after_s on a loaded machine
# (at 1 s, a replica Serve showed RUNNING late was already going back to zero in CI).
ZERO = {"min_replicas": 0, "max_replicas": 1, "downscale_to_zero_delay_s": 5, **FAST}


def proxy_file(directory: Path, **proxy_vision: Any) -> Path:
    models = [
        {"name": "echo", "engine": "fake", "capabilities": {"vision_mode": "proxy", "captioner": "cap"}},
        {"name": "cap", "engine": "fake", "deployment": {"autoscaling": ZERO}},
    ]
    return write_models(directory, models, proxy_vision=proxy_vision)


@pytest.fixture(scope="module")
def idle_captioner(serve_cluster, tmp_path_factory):
    """The captioner application `zvision` at min_replicas 0, and two main applications that use it:
    `/zwait` waits up to 30 s for a caption, `/zfast` 0.3 s (shorter than any cold start)."""
    patient = proxy_file(tmp_path_factory.mktemp("zwait"), timeout_s=30)
    hasty = proxy_file(tmp_path_factory.mktemp("zfast"), timeout_s=0.3, retry_after_s=0.5)
    common = {"captioner_app": "zvision", "decoder_gpus": 0, "decoder_cpu_replicas": 1, "captioner_gpus": 0.5}
    serve.run(build_captioner_app({"models_file": str(patient), **common}), name="zvision", route_prefix=None)
    serve.run(build_app({"models_file": str(patient), **common}), name="zwait", route_prefix="/zwait")
    serve.run(build_app({"models_file": str(hasty), **common}), name="zfast", route_prefix="/zfast")
    yield
    undeploy("zwait", "zfast", "zvision")


def captioners() -> dict[str, int]:
    return replicas("zvision", "VisionCaptioner")


def test_an_idle_captioner_has_no_replica_and_health_polls_do_not_start_one(idle_captioner, http):
    assert captioners() == {}
    for _ in range(4):
        health = http.get("/zwait/health")
        assert health.status_code == 200 and health.json()["status"] == "ok", health.json()
        assert health.json()["components"]["captioner"]["details"]["state"] == "scaled_to_zero"
        time.sleep(0.5)
    time.sleep(1.5)  # more than Serve's report interval (0.5 s) and upscale delay (1 s)
    assert captioners() == {}


def test_an_image_request_at_zero_waits_for_the_cold_start_within_its_timeout(idle_captioner, http):
    assert wait_until(lambda: captioners() == {}, timeout_s=30)
    started = time.monotonic()
    reply = http.post("/zwait/v1/chat/completions", json=image_chat("echo", data_url(png_bytes((0, 0, 255)))))
    cold_start = time.monotonic() - started
    assert reply.status_code == 200 and "x-vision-degraded" not in reply.headers
    assert "rgb(0, 0, 255)" in reply.json()["choices"][0]["message"]["content"]
    assert captioners() == {"RUNNING": 1}
    idle = time.monotonic()
    assert wait_until(lambda: captioners() == {}, timeout_s=30), captioners()
    print(f"\ncold start answered in {cold_start:.1f}s; back to zero {time.monotonic() - idle:.1f}s after it")


def test_a_cold_start_longer_than_the_timeout_degrades_then_the_started_replica_serves(idle_captioner, http):
    assert wait_until(lambda: captioners() == {}, timeout_s=30)
    image = image_chat("echo", data_url(png_bytes((0, 255, 0))))
    started = time.monotonic()
    reply = http.post("/zfast/v1/chat/completions", json=image)
    waited = time.monotonic() - started
    assert reply.status_code == 200 and reply.headers["x-vision-degraded"] == "captioner-unavailable"
    (unseen,) = reply.json()["vision"]["unseen_images"]
    assert unseen["reason"] == "captioner_timeout" and "no answer within 0.3s" in unseen["message"], unseen
    assert waited < 0.3 + 2.0, waited  # the timeout, the rest of the request, and a loaded 2-core machine
    # The call that gave up still started a replica; after retry_after_s, image requests use it.
    assert wait_until(lambda: captioners() == {"RUNNING": 1}, timeout_s=30), captioners()
    time.sleep(0.5)
    again = http.post("/zfast/v1/chat/completions", json=image)
    assert again.status_code == 200 and "x-vision-degraded" not in again.headers
    assert "rgb(0, 255, 0)" in again.json()["choices"][0]["message"]["content"]
    print(f"\ndegraded after {waited:.2f}s ({unseen['message']})")

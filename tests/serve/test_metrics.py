"""Monitoring through real Serve: the service's metrics in Ray's metrics export on the node (the
endpoint the Ray dashboard's Prometheus scrapes) move by exactly what was sent, and the access-log
line of each request is there, as JSON keys under `logging_config.encoding: JSON`.

Its own model names (`mx`, `mx-cap`) and applications keep its series apart from the other tests'."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import ray
from ray import serve

from deployments.app import build_app, build_captioner_app
from tests.conftest import data_url, png_bytes
from tests.serve.conftest import (
    BASE_URL,
    EXPORTED,
    Samples,
    image_chat,
    scrape_metrics,
    settled_metrics,
    wait_until,
    write_models,
)
from tests.serve.conftest import metric_total as total

MODEL, CAPTIONER = "mx", "mx-cap"
URL = f"{BASE_URL}/mx/v1/chat/completions"


def scrape() -> Samples:
    """Every sample of Ray's metrics export on this node whose `model` is ours."""
    return scrape_metrics(MODEL, CAPTIONER)


@pytest.fixture(scope="module")
def service(serve_cluster, tmp_path_factory):
    images = tmp_path_factory.mktemp("mx-images")
    (images / "cat.png").write_bytes(png_bytes((10, 200, 30)))
    models = [
        {
            "name": MODEL,
            "engine": "fake",
            "params": {"max_tokens": 64},
            "capabilities": {"vision_mode": "proxy", "captioner": CAPTIONER},
        },
        {"name": CAPTIONER, "engine": "fake", "captioning": {}},
    ]
    path = write_models(
        tmp_path_factory.mktemp("mx"),
        models,
        proxy_vision={"timeout_s": 5, "retry_after_s": 0.5},
        images={"file_root": str(images)},
    )
    args = {"models_file": str(path), "captioner_app": "vision-mx", "decoder_gpus": 0, "decoder_cpu_replicas": 1}
    serve._run(build_captioner_app(args), name="vision-mx", route_prefix=None, _blocking=True)
    serve.run(build_app(args), name="mx", route_prefix="/mx", logging_config={"encoding": "JSON"})
    yield images
    for app in ("mx", "vision-mx"):
        serve.delete(app)


def settle(expected: dict[tuple[str, str], float]) -> Samples:
    """The export once every `(metric, suffix)` in `expected` has reached its value."""
    return settled_metrics(
        (MODEL, CAPTIONER), lambda s: all(total(s, name, suffix) >= value for (name, suffix), value in expected.items())
    )


def test_metrics_move_by_what_was_sent_and_each_request_leaves_a_json_access_line(service):
    images = service
    usage = []
    with httpx.Client(timeout=60) as http:
        for i in range(2):
            reply = http.post(URL, json={"model": MODEL, "messages": [{"role": "user", "content": f"text {i}"}]})
            usage.append(reply.json()["usage"])
        body = {"model": MODEL, "messages": [{"role": "user", "content": "streamed"}], "stream": True}
        body["stream_options"] = {"include_usage": True}
        with http.stream("POST", URL, json=body) as streamed:
            events = [line[6:] for line in streamed.iter_lines() if line.startswith("data: {")]
        usage.append(json.loads(events[-1])["usage"])
        picture = data_url(png_bytes())
        for _ in range(2):  # the same image twice: a miss, then a cache hit
            usage.append(http.post(URL, json=image_chat(MODEL, picture)).json()["usage"])
        usage.append(http.post(URL, json=image_chat(MODEL, f"file://{images}/cat.png")).json()["usage"])
        bad = http.post(URL, json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 9})
        assert bad.status_code == 400

        # Before the captioner goes: its own metrics, and both engines reported loaded.
        samples = settle({("images_captioned", ""): 2, ("engine_loaded", ""): 2})
        assert total(samples, "images_captioned") == 2
        assert total(samples, "caption_batch_size", "_count") == 2
        assert total(samples, "caption_latency_seconds", "_count") == 2
        assert total(samples, "engine_loaded", role="decoder") == 1
        assert total(samples, "engine_loaded", role="captioner") == 1

        serve.delete("vision-mx")  # the captioner is gone: the next image request is degraded
        other = data_url(png_bytes((200, 10, 10)))
        degraded = http.post(URL, json=image_chat(MODEL, other))
        assert degraded.status_code == 200 and degraded.json()["vision"]["degraded"]
        usage.append(degraded.json()["usage"])

    answered = len(usage)  # 7 answers, and the 400
    # Each process exports on its own clock: wait for the ingress's and the decoder's counts alike.
    decoder = {(name, "_count"): answered for name in ("e2e_request_latency_seconds", "time_per_output_token_seconds")}
    expected = {("http_requests", ""): answered + 1, ("requests_degraded", ""): 1, ("request_success", ""): answered}
    expected[("prompt_tokens", "")] = sum(u["prompt_tokens"] for u in usage)
    expected[("generation_tokens", "")] = sum(u["completion_tokens"] for u in usage)
    samples = settle(expected | decoder)
    route = "/v1/chat/completions"
    assert total(samples, "http_requests", route=route, status="200") == answered
    assert total(samples, "http_requests", route=route, status="400") == 1
    assert total(samples, "requests_rejected", status="400", reason="invalid_request_error") == 1
    assert total(samples, "requests_degraded") == 1
    assert total(samples, "caption_cache_hits") == 1
    assert total(samples, "caption_cache_misses") == 3  # two images captioned, one degraded
    assert total(samples, "caption_cache_entries") == 2
    assert total(samples, "caption_cache_bytes") > 0
    sent = [png_bytes(), png_bytes(), png_bytes((10, 200, 30)), png_bytes((200, 10, 10))]
    assert total(samples, "image_bytes") == sum(len(image) for image in sent)
    assert total(samples, "image_pixels") == 4 * 48 * 32
    assert total(samples, "image_fetch_latency_seconds", "_count") == 1  # the file:// image
    # The decoder: every answer, with exactly the tokens the responses' usage reported
    assert total(samples, "request_success", finished_reason="stop") == answered
    assert total(samples, "prompt_tokens") == sum(u["prompt_tokens"] for u in usage)
    assert total(samples, "generation_tokens") == sum(u["completion_tokens"] for u in usage)
    for histogram in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert total(samples, histogram, "_count") == answered, histogram
    assert total(samples, "time_per_output_token_seconds", "_count") == answered
    for gauge in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert any(name == EXPORTED[gauge] for name, _ in samples), gauge

    lines = json_access_lines()
    assert len(lines) == answered + 1
    bad_line = next(line for line in lines if line["status"] == 400)
    assert (bad_line["error"], bad_line["model"]) == ("invalid_request_error", MODEL)
    hit = [line for line in lines if line["cache_hits"] == 1]
    assert len(hit) == 1 and hit[0]["images"] == 1 and hit[0]["path"] == "/mx/v1/chat/completions"
    assert hit[0]["request_id"] in hit[0]["message"] and hit[0]["application"] == "mx"  # Serve's keys beside ours
    assert {"request_id", "prompt_tokens", "completion_tokens", "ttft_s", "duration_s", "degraded"} <= set(hit[0])
    assert len([line for line in lines if line["degraded"] in ("captioner_unavailable", "captioner_timeout")]) == 1


def json_access_lines() -> list[dict]:
    """The access lines of the `mx` Ingress replica's log, which Serve writes as JSON here."""
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs" / "serve"
    found: list[dict] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not found:
        found = [
            record
            for path in logs.glob("replica_mx_Ingress_*.log")
            for line in path.read_text(errors="replace").splitlines()
            if line.startswith("{") and (record := json.loads(line)).get("message", "").startswith("access ")
        ]
    return found


def test_counters_and_gauges_are_exported_at_zero_before_their_first_event(service):
    """A dashboard or an alert on a rate reads 0, not "no data", for label values nothing here records."""
    zeros = [
        ("requests_degraded", {"reason": "captioner_timeout"}),
        ("caption_failures", {"kind": "oom"}),
        ("image_fetch_failures", {"scheme": "https"}),
        ("requests_rejected", {"status": "413", "reason": "request_too_large"}),
    ]
    present = [*zeros, ("engine_loaded", {"role": "captioner"}), ("request_success", {"finished_reason": "length"})]
    samples: dict = {}

    def exported() -> bool:
        nonlocal samples
        samples = scrape()
        return all(
            any(n == EXPORTED[name] and set(labels.items()) <= tags for n, tags in samples) for name, labels in present
        )

    assert wait_until(exported, timeout_s=60), [p for p in present if not total(samples, p[0], **p[1])]
    for name, labels in zeros:
        assert total(samples, name, **labels) == 0, name

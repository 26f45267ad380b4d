"""Load ramp against an autoscaled decoder: replicas over time next to throughput and latency.

    .venv/bin/python -m scripts.bench ramp                       # concurrency 1, then 16, then 1
    .venv/bin/python -m scripts.bench ramp --phases 1:20 16:60 1:45 --window-s 3

A local Ray instance with fake GPUs (`ray.init(num_gpus=...)`) runs the main application (ingress
and decoder, no captioner) built by `build_app` from a models.yaml written here: `engine: fake`
with `fake.token_delay_ms` per token and `fill_to_max_tokens`, so that every request generates
`--max-tokens` tokens at a fixed pace, and `deployment.autoscaling` from min 1 to `--max-replicas`.

A fair measurement of what a replica adds: the fake engine sleeps per token and has no batch
limit of its own, so each replica is bounded by `deployment.max_ongoing_requests` =
`params.max_num_seqs` (one batch, none waiting in the replica: the rest wait in Serve's queue),
and Serve aims at that many ongoing requests per replica (`target_ongoing_requests`). One
replica then serves at most `max_num_seqs` requests at a time, as a real engine's batch does.

Output, JSON lines: one per window of `--window-s` (phase, concurrency, Serve's replica states at
the window's end, requests finished in it, output tokens/s, latency p50/p95, failures), then a
summary: tokens/s with 1 replica and with 2 over the windows of the high phase whose replicas were
RUNNING and unchanged from start to end (the phase's first window excluded): the median of those
windows, and their tokens over their time (windows hold whole requests, so single windows are
coarse), each ratio, and when the replicas were first seen at max and back at min.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import ray
import yaml
from ray import serve

from deployments.app import build_app
from scripts.bench.common import ROOT, arguments, emit, pct

# This checkout in Ray's workers (below).
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)


APP, DEPLOYMENT, MODEL = "ramp", "PrimaryDecoder", "ramp"


def models_yaml(args: argparse.Namespace, directory: Path) -> Path:
    seqs = args.max_num_seqs
    entry = {
        "name": MODEL,
        "engine": "fake",
        "params": {"max_num_seqs": seqs, "max_tokens": args.max_tokens, "stream_interval_ms": args.stream_interval_ms},
        "fake": {"token_delay_ms": args.token_delay_ms, "fill_to_max_tokens": True},
        "deployment": {
            "max_ongoing_requests": seqs,
            "autoscaling": {
                "min_replicas": 1,
                "max_replicas": args.max_replicas,
                "target_ongoing_requests": seqs,
                "upscale_delay_s": args.upscale_delay_s,
                "downscale_delay_s": args.downscale_delay_s,
                "look_back_period_s": args.look_back_period_s,
                "metrics_interval_s": args.metrics_interval_s,
            },
        },
    }
    path = directory / "models.yaml"
    path.write_text(yaml.safe_dump({"models": [entry]}))
    return path


@dataclass
class Done:
    ended: float
    latency_s: float
    tokens: int
    ok: bool


def replica_states() -> dict[str, int]:
    states = serve.status().applications[APP].deployments[DEPLOYMENT].replica_states
    return {str(getattr(s, "value", s)): n for s, n in states.items() if n}


async def ramp(args: argparse.Namespace) -> None:
    base = f"http://127.0.0.1:{args.port}"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "max_tokens": args.max_tokens}
    done: list[Done] = []
    concurrency = 0
    stop = asyncio.Event()

    async def worker(index: int, client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            if index >= concurrency:
                await asyncio.sleep(0.05)
                continue
            started = time.monotonic()
            try:
                reply = await client.post("/v1/chat/completions", json=body)
                ok = reply.status_code == 200
                tokens = reply.json()["usage"]["completion_tokens"] if ok else 0
            except httpx.HTTPError:
                ok, tokens = False, 0
            done.append(Done(time.monotonic(), time.monotonic() - started, tokens, ok))

    most = max(c for c, _ in args.phases)
    limits = httpx.Limits(max_connections=most, max_keepalive_connections=most)
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as client:
        workers = [asyncio.create_task(worker(i, client)) for i in range(most)]
        t0 = time.monotonic()
        windows: list[dict[str, Any]] = []
        for phase, (level, seconds) in enumerate(args.phases):
            concurrency = level
            phase_end = time.monotonic() + seconds
            first = True
            before = await asyncio.to_thread(replica_states)
            while time.monotonic() < phase_end - 1e-3:
                start = time.monotonic()
                await asyncio.sleep(min(args.window_s, phase_end - start))
                end = time.monotonic()
                states = await asyncio.to_thread(replica_states)
                finished = [d for d in done if start <= d.ended < end]
                latencies = [d.latency_s for d in finished if d.ok]
                window = {
                    "t": round(end - t0, 1),
                    "phase": phase,
                    "concurrency": level,
                    "replicas": states,
                    "finished": len(finished),
                    "tok_s": round(sum(d.tokens for d in finished if d.ok) / (end - start), 1),
                    "p50_s": pct(latencies, 0.5) if latencies else None,
                    "p95_s": pct(latencies, 0.95) if latencies else None,
                    "failed": sum(not d.ok for d in finished),
                }
                steady = states == before and set(states) == {"RUNNING"} and not first
                windows.append(
                    {**window, "_steady": steady, "_tokens": window["tok_s"] * (end - start), "_s": end - start}
                )
                emit(window)
                before, first = states, False
        stop.set()
        await asyncio.gather(*workers)
    summarize(args, windows, done)


def summarize(args: argparse.Namespace, windows: list[dict[str, Any]], done: list[Done]) -> None:
    high = max(c for c, _ in args.phases)
    steady: dict[int, list[dict[str, Any]]] = {}
    for w in windows:
        if w["_steady"] and w["concurrency"] == high:
            steady.setdefault(w["replicas"]["RUNNING"], []).append(w)
    medians = {n: statistics.median(w["tok_s"] for w in ws) for n, ws in sorted(steady.items())}
    means = {n: round(sum(w["_tokens"] for w in ws) / sum(w["_s"] for w in ws), 1) for n, ws in sorted(steady.items())}
    starts = [sum(s for _, s in args.phases[:p]) for p in range(len(args.phases))]
    rise = next(p for p, (c, _) in enumerate(args.phases) if c == high)
    fall = rise + 1 if rise + 1 < len(args.phases) else None
    at_max = next((w for w in windows if w["replicas"] == {"RUNNING": args.max_replicas}), None)
    at_min = next(
        (w for w in windows if fall is not None and w["phase"] >= fall and w["replicas"] == {"RUNNING": 1}), None
    )
    emit(
        {
            "summary": "ramp",
            "phases": [f"c{c} for {s:g}s" for c, s in args.phases],
            "tok_s_median_by_replicas": medians,
            "tok_s_mean_by_replicas": means,
            "windows_by_replicas": {n: len(ws) for n, ws in sorted(steady.items())},
            "ratio_2_over_1_median": round(medians[2] / medians[1], 2) if 1 in medians and 2 in medians else None,
            "ratio_2_over_1_mean": round(means[2] / means[1], 2) if 1 in means and 2 in means else None,
            "max_seen_s_after_rise": round(at_max["t"] - starts[rise], 1) if at_max else None,
            "min_seen_s_after_fall": round(at_min["t"] - starts[fall], 1) if at_min and fall is not None else None,
            "requests": len(done),
            "failed": sum(not d.ok for d in done),
            "ideal_tok_s_per_replica": round(args.max_num_seqs * 1000 / args.token_delay_ms, 1),
        }
    )


def phase(text: str) -> tuple[int, float]:
    level, _, seconds = text.partition(":")
    return int(level), float(seconds)


def main(argv: list[str] | None = None) -> None:
    parser = arguments("ramp", __doc__)
    parser.add_argument("--phases", nargs="+", type=phase, default=[(1, 20), (16, 60), (1, 45)])
    parser.add_argument("--window-s", type=float, default=3.0, help="one JSON line per window")
    parser.add_argument("--port", type=int, default=8761)
    parser.add_argument("--gpus", type=int, default=1, help="fake GPUs given to Ray; each replica takes half of one")
    parser.add_argument("--token-delay-ms", type=float, default=40.0)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=4, help="also each replica's max_ongoing_requests")
    parser.add_argument("--stream-interval-ms", type=float, default=250.0, help="fewer Serve messages per request")
    parser.add_argument("--max-replicas", type=int, default=2)
    parser.add_argument("--upscale-delay-s", type=float, default=15.0, help="long enough to measure one replica")
    parser.add_argument("--downscale-delay-s", type=float, default=10.0)
    parser.add_argument("--look-back-period-s", type=float, default=4.0)
    parser.add_argument("--metrics-interval-s", type=float, default=1.0)
    args = parser.parse_args(argv)

    ray.init(
        address="local",
        num_cpus=max(4, os.cpu_count() or 1),
        num_gpus=args.gpus,
        include_dashboard=False,
        log_to_driver=False,
    )
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    try:
        with tempfile.TemporaryDirectory() as tmp:
            models = models_yaml(args, Path(tmp))
            serve.run(build_app({"models_file": str(models), "decoder_gpus": 0.5}), name=APP, route_prefix="/")
            emit(
                {"config": yaml.safe_load(models.read_text())["models"][0], "gpus": args.gpus, "cores": os.cpu_count()}
            )
            asyncio.run(ramp(args))
    finally:
        serve.shutdown()
        ray.shutdown()

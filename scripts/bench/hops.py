"""Serve's own path, hop by hop, with no model time in it: the service (`serve run`, serve_config.yaml)
over an instant fake decoder, and the p50 of requests that go as far as the ingress (`GET
/v1/models`: HTTP, Serve's proxy, the ingress replica), one hop further to a decoder replica and back
(`POST /tokenize`), and a one-token chat, whole and streamed (the decoder's generate). The
differences say what each hop costs on this machine; run it with an environment variable set and
unset to see what a Serve setting changes (the service gets the environment as set).

    .venv/bin/python -m scripts.bench hops                   # --requests 200 --runs 2
    RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=0 .venv/bin/python -m scripts.bench hops

Prints one JSON line per run."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from scripts.bench.common import arguments, emit, start_ours
from scripts.bench.serve import machine
from scripts.bench.store import MODEL, models_file


def p50_ms(call: Callable[[], httpx.Response], requests: int) -> float:
    for _ in range(20):  # warm
        call().raise_for_status()
    took = []
    for _ in range(requests):
        started = time.perf_counter()
        call().raise_for_status()
        took.append(time.perf_counter() - started)
    return round(1000 * statistics.median(took), 2)


def main(argv: list[str]) -> None:
    parser = arguments("hops", __doc__)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--port", type=int, default=8100)
    args = parser.parse_args(argv)
    setting = {k: v for k, v in os.environ.items() if k.startswith("RAY_SERVE_")}
    emit({"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "environment": setting})
    with tempfile.TemporaryDirectory(prefix="bench-hops-") as work:
        models = models_file(Path(work), Path(work) / "storage", max_tokens=1)
        server = start_ours(models, args.port, name="hops", vision=False)
        try:
            client = httpx.Client(base_url=server.base_url, timeout=60)
            chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
            for run in range(args.runs):
                emit(
                    {
                        "run": run + 1,
                        "requests": args.requests,
                        "ingress_ms": p50_ms(lambda: client.get("/v1/models"), args.requests),
                        "decoder_round_trip_ms": p50_ms(
                            lambda: client.post("/tokenize", json={"model": MODEL, "prompt": "hi"}), args.requests
                        ),
                        "chat_whole_ms": p50_ms(lambda: client.post("/v1/chat/completions", json=chat), args.requests),
                        "chat_streamed_ms": p50_ms(
                            lambda: client.post("/v1/chat/completions", json={**chat, "stream": True}), args.requests
                        ),
                    }
                )
        finally:
            server.stop()

"""Serve's own path, hop by hop, with no model time in it: the service (`serve run`, serve_config.yaml)
over an instant fake decoder, and the p50 of requests that go as far as the ingress (`GET
/v1/models`: HTTP, Serve's proxy, the ingress replica), one hop further to a decoder replica and back
(`POST /tokenize`), and a one-token chat, whole and streamed (the decoder's generate). The
differences say what each hop costs on this machine; run it with an environment variable set and
unset to see what a Serve setting changes (the service gets the environment as set).

`--bare` puts Ray Serve itself beside it, in the same run: an application with none of the service's
code (`bare_serve.py`: an ingress deployment and a second one behind its handle, answering the same
requests), started in turn with the service in each run. The service's figures less the bare
application's are what our code adds; the bare application's are Serve's floor on this machine.

    .venv/bin/python -m scripts.bench hops                   # --requests 200 --runs 2
    .venv/bin/python -m scripts.bench hops --bare --runs 3   # beside a bare Serve application
    RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=0 .venv/bin/python -m scripts.bench hops

Prints one JSON line per run and application.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from scripts.bench.common import Server, arguments, emit, serve_run, start_ours
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


def start_bare(work: Path, port: int) -> Server:
    """`serve run` of `bare_serve.py`'s application, in the service's environment (`serve_run`)."""
    config = {
        "proxy_location": "EveryNode",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [{"name": "bare", "route_prefix": "/", "import_path": "scripts.bench.bare_serve:app"}],
    }
    return serve_run(
        "bare-serve", config, work / "bare_serve_config.yaml", "/v1/models", lambda r: r.status_code == 200
    )


def measure(server: Server, requests: int) -> dict[str, Any]:
    client = httpx.Client(base_url=server.base_url, timeout=60)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    tokenize = {"model": MODEL, "prompt": "hi"}
    return {
        "requests": requests,
        "ingress_ms": p50_ms(lambda: client.get("/v1/models"), requests),
        "decoder_round_trip_ms": p50_ms(lambda: client.post("/tokenize", json=tokenize), requests),
        "chat_whole_ms": p50_ms(lambda: client.post("/v1/chat/completions", json=chat), requests),
        "chat_streamed_ms": p50_ms(
            lambda: client.post("/v1/chat/completions", json={**chat, "stream": True}), requests
        ),
    }


def main(argv: list[str]) -> None:
    parser = arguments("hops", __doc__)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--bare", action="store_true", help="a bare Serve application beside the service, in turn")
    args = parser.parse_args(argv)
    setting = {k: v for k, v in os.environ.items() if k.startswith("RAY_SERVE_")}
    emit({"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "environment": setting})
    with tempfile.TemporaryDirectory(prefix="bench-hops-") as tmp:
        work = Path(tmp)
        models = models_file(work, work / "storage", max_tokens=1)
        starts: dict[str, Callable[[], Server]] = {}
        if args.bare:
            starts["bare-serve"] = lambda: start_bare(work, args.port)
        starts["ours"] = lambda: start_ours(models, args.port, name="hops", vision=False)
        for run in range(args.runs):
            for name, start in starts.items():
                server = start()
                try:
                    emit({"run": run + 1, "app": name, **measure(server, args.requests)})
                finally:
                    server.stop()

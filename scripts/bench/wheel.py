r"""The xllamacpp wheel against `llama-server` built on this machine, with nothing of this service
between: both are llama.cpp's own HTTP server (xllamacpp runs it in a Python process and listens on
127.0.0.1), laid out as the engine runs models.yaml's first model (slots, KV cells, threads), asked
the same streaming greedy chats by the same client, one server at a time, alternating `--runs` times.
With `--local-wheel` a third: xllamacpp built on this machine (`scripts/build_llama.sh`, or `pip
wheel --no-binary xllamacpp`), from that wheel file, without installing it.

    .venv/bin/python -m scripts.bench wheel --llama-server PATH/llama-server \
        --local-wheel /tmp/xllamacpp-*.whl

Prints one JSON line per server, run and concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from scripts.bench.common import ROOT, Server, arguments, emit, start_llama_server
from scripts.bench.serve import llama_server_layout, machine, text_run


class XllamacppServer:
    """xllamacpp's server in a process of its own (this module's `--child`), from `path` on its
    Python path when given (a local build), else the installed wheel.
    """

    def __init__(self, name: str, layout: dict[str, Any], path: Path | None) -> None:
        self.name = name
        address = Path(tempfile.mkstemp(prefix="bench-xllamacpp-")[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (path, ROOT) if p)}
        child = [sys.executable, "-m", "scripts.bench", "wheel", "--child", json.dumps(layout), str(address)]
        self.proc = subprocess.Popen(child, cwd=ROOT, env=env, start_new_session=True)
        deadline = time.monotonic() + 300
        while not address.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name} did not start")
            time.sleep(0.2)
        self.base_url = address.read_text()
        address.unlink()

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def child(layout: dict[str, Any], address: Path) -> None:
    """llama.cpp's server as llama-server runs it (`start_llama_server`'s flags), until killed."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = layout["gguf"]
    params.n_parallel, params.n_ctx, params.kv_unified = layout["slots"], layout["cells"], layout["unified"]
    params.cpuparams.n_threads, params.cpuparams_batch.n_threads = layout["threads"], layout["threads_batch"]
    params.cache_ram_mib, params.ui, params.verbosity = 0, False, 1
    params.n_threads_http = layout["slots"] + 2
    server = xllamacpp.Server(params)
    base = str(server.listening_address).rstrip("/")
    while True:  # up once /health answers 200 (503 while the model loads)
        try:
            if httpx.get(base + "/health").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    print(f"xllamacpp from {xllamacpp.__file__}", flush=True)
    address.write_text(base)
    while True:
        time.sleep(3600)


async def bench(argv: list[str]) -> None:
    parser = arguments("wheel", __doc__)
    parser.add_argument("--llama-server", type=Path, help="the llama-server binary (required)")
    parser.add_argument("--local-wheel", type=Path, help="an xllamacpp wheel built on this machine")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--port", type=int, default=8201)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child[0]), Path(args.child[1]))
        return
    if args.llama_server is None:
        parser.error("--llama-server PATH is required")
    layout = llama_server_layout(ROOT / "models.yaml")
    as_json = {**layout, "gguf": str(layout["gguf"])}
    emit({"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "layout": as_json})
    with tempfile.TemporaryDirectory(prefix="bench-wheel-") as tmp:
        local = None
        if args.local_wheel:
            local = Path(tmp)
            zipfile.ZipFile(args.local_wheel).extractall(local)
        starts: dict[str, Callable[[], Server | XllamacppServer]] = {
            "llama-server": lambda: start_llama_server(args.llama_server, args.port, **layout),
            "xllamacpp-wheel": lambda: XllamacppServer("xllamacpp-wheel", as_json, None),
        }
        if local is not None:
            starts["xllamacpp-local"] = lambda: XllamacppServer("xllamacpp-local", as_json, local)
        model = layout["gguf"].name
        for run in range(args.runs):
            for name, start in starts.items():
                server = start()
                try:
                    await text_run(server, model, 1, 2, 8)  # warm
                    for c in args.concurrency:
                        record = await text_run(server, model, c, max(8, 4 * c), 64)
                        emit({"run": run + 1, "server": name, **{k: v for k, v in record.items() if k != "server"}})
                finally:
                    server.stop()


def main(argv: list[str]) -> None:
    asyncio.run(bench(argv))

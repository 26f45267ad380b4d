"""Where the machine's cores go while the service runs: each Ray process's CPU time (user + system)
over `--idle-s` seconds of the settled, idle service, then over a streaming run at concurrency 1
(`--requests` greedy chats of `--max-tokens`), in cores (1.0: one core all the time). The service is
`serve`'s: models.yaml's first model and a small local captioner, serve_config.yaml's deployments.

    .venv/bin/python -m scripts.bench census
    .venv/bin/python -m scripts.bench census --params '{"cpu_threads": 1, "cpu_threads_batch": "all"}'
    .venv/bin/python -m scripts.bench census --bare      # idle only: hops' bare Serve application

Prints one JSON line per phase: the cores in all and per process (those above 0.3% of a core).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil

from scripts.bench.common import ROOT, arguments, emit, primary_name, start_ours, write_models
from scripts.bench.hops import start_bare
from scripts.bench.serve import machine, text_run

RAY = ("ray::", "gcs_server", "raylet", "dashboard", "log_monitor", "ray.serve.scripts", "runtime_env", "monitor.py")


def service_processes() -> dict[int, tuple[str, psutil.Process]]:
    """Ray's processes (named by their title, `ray::ServeReplica:default:Ingress`, or their program)
    and this one (the benchmark's client).
    """
    found = {}
    for process in psutil.process_iter(["pid", "cmdline"]):
        argv = process.info["cmdline"] or [""]
        command = " ".join(argv)
        if process.info["pid"] == os.getpid():
            found[process.info["pid"]] = ("the benchmark's client", process)
        elif any(k in command for k in RAY):
            program = argv[0].split()[0].rsplit("/", 1)[-1]
            if program.startswith("python"):  # a Python program: its module, else its script
                module = argv.index("-m") + 1 if "-m" in argv[:-1] else None
                program = argv[module] if module else next((a for a in argv[1:] if not a.startswith("-")), program)
                program = program.rsplit("/", 1)[-1]
            found[process.info["pid"]] = (f"{program} ({process.info['pid']})", process)
    return found


def cpu_seconds(processes: dict[int, tuple[str, psutil.Process]]) -> dict[int, float]:
    seconds = {}
    for pid, (_, process) in processes.items():
        try:
            times = process.cpu_times()
            seconds[pid] = times.user + times.system
        except psutil.Error:  # gone
            pass
    return seconds


async def phase(name: str, work: Callable[[], Awaitable[dict[str, Any] | None]]) -> None:
    processes = service_processes()
    before, started = cpu_seconds(processes), time.monotonic()
    result = await work()
    after, took = cpu_seconds(processes), time.monotonic() - started
    cores = {processes[pid][0]: (after.get(pid, 0.0) - before[pid]) / took for pid in before}
    top = {k: round(v, 3) for k, v in sorted(cores.items(), key=lambda kv: -kv[1]) if v >= 0.003}
    emit({"phase": name, "seconds": round(took, 1), "cores": round(sum(cores.values()), 3), "per_process": top})
    if result:
        emit(result)


async def bench(argv: list[str]) -> None:
    parser = arguments("census", __doc__)
    parser.add_argument("--idle-s", type=float, default=30)
    parser.add_argument("--settle-s", type=float, default=30, help="after the ready line, before measuring")
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--params", type=json.loads, default={}, help="overrides of the primary's params (JSON)")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--bare", action="store_true", help="a Serve application with none of our code, idle")
    args = parser.parse_args(argv)
    emit({"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "params": args.params})

    async def idle() -> None:
        await asyncio.sleep(args.idle_s)

    if args.bare:
        with tempfile.TemporaryDirectory(prefix="bench-census-") as tmp:
            server = start_bare(Path(tmp), args.port)
            try:
                await asyncio.sleep(args.settle_s)
                await phase("idle", idle)
            finally:
                server.stop()
        return
    from scripts.bench.tiny_models import SMALL_VLM, build_tiny_vlm

    work = ROOT / "models" / "bench"
    captioner = build_tiny_vlm(work / "small-vlm", SMALL_VLM)
    server = start_ours(write_models(work, captioner, 8, params=args.params), args.port)
    try:
        await asyncio.sleep(args.settle_s)
        model = primary_name()

        async def stream() -> dict[str, Any]:
            return await text_run(server, model, 1, args.requests, args.max_tokens)

        await phase("idle", idle)
        await phase("c1", stream)
    finally:
        server.stop()


def main(argv: list[str]) -> None:
    asyncio.run(bench(argv))

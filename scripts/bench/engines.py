"""The decoder engines alone (no Serve, no HTTP), side by side on the default model: models.yaml's
first entry with `engine: llama.cpp` (as it runs on CPU) and with `engine: transformers` plus
`quantization: int4-cpu` (models.yaml's transformers profile).
Streaming, greedy, `--max-tokens` new tokens at each concurrency. Prints one JSON line per
configuration: output tokens/s, TTFT and end-to-end p50, and the process's resident memory.

    .venv/bin/python -m scripts.bench engines                       # both engines, concurrency 1 and 8
    .venv/bin/python -m scripts.bench engines --engines llama.cpp --params '{"mem": null}'

Each engine runs in a process of its own (so its memory is its own), with the environment a
decoder replica gets (`deployments.options.REPLICA_ENV`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import psutil

from scripts.bench.common import ROOT, arguments, closed_loop, emit, engine_chat

ENGINE_PARAMS = {"transformers": {"quantization": "int4-cpu"}}  # under --params: the transformers profile's


def rss_mb() -> int:
    return psutil.Process().memory_info().rss // 2**20


async def run_engine(engine_name: str, concurrency: list[int], rounds: int, max_tokens: int, params: dict) -> None:
    """One engine in this process: load it, then each concurrency in turn."""
    from deployments.config import load_models_file
    from deployments.engines import create_text_engine

    model = load_models_file(ROOT / "models.yaml").models[0]
    params = {**ENGINE_PARAMS.get(engine_name, {}), **params}
    model = model.model_copy(
        update={"engine": engine_name, "params": model.params.model_copy(update=params)}, deep=True
    )
    started = time.perf_counter()
    engine = create_text_engine(model)
    load_s, loaded_mb = round(time.perf_counter() - started, 1), rss_mb()

    one = engine_chat(engine, max_tokens)
    await asyncio.gather(*(one("Say hello.") for _ in range(2)))  # the first steps are slower
    for c in concurrency:
        results, wall = await closed_loop(one, c, rounds)
        emit(
            {
                "engine": engine_name,
                "concurrency": c,
                "requests": len(results),
                "max_tokens": max_tokens,
                "output_tok_s": round(sum(r[2] for r in results) / wall, 1),
                "ttft_p50_s": round(statistics.median(r[0] for r in results), 3),
                "e2e_p50_s": round(statistics.median(r[1] for r in results), 2),
                "rss_mb": rss_mb(),
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                "rss_after_load_mb": loaded_mb,
                "load_s": load_s,
                "threads": engine.describe().get("cpu_threads"),
                "params": params or "models.yaml",
            }
        )
    engine.close()


def main(argv: list[str] | None = None) -> None:
    parser = arguments("engines", __doc__)
    parser.add_argument("--engines", nargs="+", default=["llama.cpp", "transformers"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="requests per concurrency slot (at least 4 in all)")
    parser.add_argument("--params", type=json.loads, default={}, help="overrides of the entry's params (JSON)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        asyncio.run(run_engine(args.child, args.concurrency, args.rounds, args.max_tokens, args.params))
        return

    from deployments.options import REPLICA_ENV

    env = {**os.environ, **REPLICA_ENV["PrimaryDecoder"], "PYTHONPATH": str(ROOT)}
    emit({"bench": "engines", "date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "args": vars(args)})
    for engine in args.engines:
        command = [
            sys.executable,
            "-m",
            "scripts.bench",
            "engines",
            "--child",
            engine,
            "--max-tokens",
            str(args.max_tokens),
        ]
        command += ["--rounds", str(args.rounds), "--params", json.dumps(args.params), "--concurrency"]
        command += [str(c) for c in args.concurrency]
        subprocess.run(command, env=env, check=True)

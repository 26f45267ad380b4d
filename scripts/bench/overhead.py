"""Serve's own cost on one decoder: the same model, engine and prompts in a process of their own (the
engine alone, in a decoder replica's environment) and through the service (`serve run`: HTTP, Serve's
proxy, the ingress, the decoder's handle and replica), one after the other in one run. Per
concurrency: output tokens/s and time to first token p50 of each; then the TTFT that the service adds
and its tokens/s over the engine's.

    .venv/bin/python -m scripts.bench overhead                       # the offline default, c1 and c8
    .venv/bin/python -m scripts.bench overhead --gpu-shape smollm2-1.7b --tokenizer DIR --concurrency 1 32

The decoder is models.yaml's first entry (its primary, served alone: no captioner), or with
`--gpu-shape` a random-weight model of that shape (`scripts/bench/gpu.py`) on the transformers static
decoder, as `scripts/gpu_check.sh` runs it on a lent GPU. Extra environment for the service (e.g.
`RAY_SERVE_ENABLE_DIRECT_INGRESS=1`) is passed to `serve run` as set.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from scripts.bench.common import ROOT, arguments, closed_loop, emit, engine_chat, start_ours


def decoder_models(directory: Path, gpu_shape: str | None, tokenizer: Path | None, slots: int) -> Path:
    """A models.yaml with the decoder alone: models.yaml's first entry, or a random model of `gpu_shape`."""
    if gpu_shape:
        import torch

        from scripts.bench.gpu import build_model

        if tokenizer is None:
            raise SystemExit("--gpu-shape needs --tokenizer")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model_dir, _ = build_model(gpu_shape, tokenizer, directory / gpu_shape, device)
        entry: dict[str, Any] = {
            "name": "bench",
            "engine": "transformers",
            "local_path": str(model_dir),
            "params": {"batching": "static", "max_num_seqs": slots, "max_model_len": 1024, "temperature": 0},
        }
    else:
        entry = yaml.safe_load((ROOT / "models.yaml").read_text())["models"][0]
        entry["local_path"] = str((ROOT / entry["local_path"]).resolve())
        entry["capabilities"] = {k: v for k, v in entry.get("capabilities", {}).items() if k != "captioner"}
        entry["capabilities"]["vision_mode"] = "none"
    path = directory / "models-overhead.yaml"
    path.write_text(yaml.safe_dump({"models": [entry]}))
    return path


async def engine_alone(models_file: Path, concurrency: list[int], rounds: int, max_tokens: int) -> None:
    """The decoder's engine in this process, as a replica builds it (`engine: auto` resolved likewise)."""
    from deployments.config import load_models_file
    from deployments.engines import create_text_engine

    engine = create_text_engine(load_models_file(models_file).models[0])
    one = engine_chat(engine, max_tokens)
    await asyncio.gather(*(one("Say hello.") for _ in range(4)))  # as the service's warm-up
    for c in concurrency:
        results, wall = await closed_loop(one, c, rounds)
        emit(record("engine", c, results, wall))
    engine.close()


def record(where: str, concurrency: int, results: list[tuple[float, float, int]], wall: float) -> dict[str, Any]:
    return {
        "where": where,
        "concurrency": concurrency,
        "requests": len(results),
        "output_tok_s": round(sum(r[2] for r in results) / wall, 1),
        "ttft_p50_ms": round(1000 * statistics.median(r[0] for r in results), 1),
    }


async def service(models_file: Path, concurrency: list[int], rounds: int, max_tokens: int, port: int) -> list[dict]:
    from scripts.bench.serve import text_run

    server = start_ours(models_file, port, name="overhead", vision=False)
    model = load_name(models_file)
    try:
        records = []
        for c in concurrency:
            run = await text_run(server, model, c, max(4, c * rounds), max_tokens)
            records.append(
                {
                    "where": "service",
                    "concurrency": c,
                    "requests": run["requests"],
                    "output_tok_s": run["output_tok_s"],
                    "ttft_p50_ms": round(1000 * run["ttft_p50_s"], 1),
                }
            )
            emit(records[-1])
        return records
    finally:
        server.stop()


def load_name(models_file: Path) -> str:
    return str(yaml.safe_load(models_file.read_text())["models"][0]["name"])


def main(argv: list[str] | None = None) -> None:
    parser = arguments("overhead", __doc__)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4, help="requests per concurrency slot (at least 4 in all)")
    parser.add_argument("--gpu-shape", help="a random model of this shape (scripts/bench/gpu.py SHAPES)")
    parser.add_argument("--tokenizer", type=Path, help="its tokenizer (with --gpu-shape)")
    parser.add_argument("--port", type=int, default=8110)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # the engine alone, on this models file
    args = parser.parse_args(argv)
    if args.child:
        asyncio.run(engine_alone(args.child, args.concurrency, args.rounds, args.max_tokens))
        return

    from deployments.options import REPLICA_ENV

    work = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    models_file = decoder_models(work, args.gpu_shape, args.tokenizer, max(args.concurrency))
    emit(
        {
            "bench": "overhead",
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "cpus": os.cpu_count(),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        }
    )
    child = [sys.executable, "-m", "scripts.bench", "overhead", "--child", str(models_file)]
    child += ["--max-tokens", str(args.max_tokens), "--rounds", str(args.rounds), "--concurrency"]
    done = subprocess.run(
        child + [str(c) for c in args.concurrency],
        env={**os.environ, **REPLICA_ENV["PrimaryDecoder"], "PYTHONPATH": str(ROOT)},
        check=True,
        capture_output=True,
        text=True,
    )
    print(done.stdout, end="", flush=True)
    alone = {r["concurrency"]: r for r in map(json.loads, done.stdout.splitlines()) if r.get("where") == "engine"}
    served = asyncio.run(service(models_file, args.concurrency, args.rounds, args.max_tokens, args.port))
    for run in served:
        engine = alone[run["concurrency"]]
        emit(
            {
                "concurrency": run["concurrency"],
                "ttft_added_ms": round(run["ttft_p50_ms"] - engine["ttft_p50_ms"], 1),
                "tok_s_ratio": round(run["output_tok_s"] / engine["output_tok_s"], 3),
            }
        )

"""LoRA adapters at concurrency 8 on the offline default (the llama.cpp decoder through Serve, no
vision): the serve benchmark's text workload on the base model, then the same requests spread over
`--adapters` random GGUF LoRA adapters (request i names adapter i modulo their count), and the ratio
of their tokens/s. The adapters are written for the shipped GGUF with the `gguf` package
(`lora_adapters.build_gguf_lora`: rank `--rank`, the query and value projections of every block).

    .venv/bin/python -m scripts.bench lora

Prints one JSON line per run, and the ratio; then the decoder's log lines about adapters.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import yaml

from scripts.bench.common import arguments, emit, start_ours
from scripts.bench.lora_adapters import build_gguf_lora
from scripts.bench.prompts import models_file
from scripts.bench.serve import machine, text_run


def main(argv: list[str] | None = None) -> None:
    parser = arguments("lora", __doc__)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4, help="requests per concurrency slot")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--settle-s", type=float, default=10)
    parser.add_argument("--port", type=int, default=8100)
    args = parser.parse_args(argv)
    emit({"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S")})
    work = Path(tempfile.mkdtemp(prefix="bench-lora-"))
    path = models_file(work, invariant=False)
    models = yaml.safe_load(path.read_text())
    primary = models["models"][0]
    gguf = Path(primary["local_path"]) / primary["weight_file"]
    names = [f"a{i}" for i in range(args.adapters)]
    adapters = {
        name: str(build_gguf_lora(gguf, work / f"{name}.gguf", seed=i, rank=args.rank)) for i, name in enumerate(names)
    }
    primary["params"]["lora"] = {"adapters": adapters, "max_rank": args.rank}
    path.write_text(yaml.safe_dump(models))
    model = primary["name"]
    requests = max(4, args.concurrency * args.rounds)
    server = start_ours(path, args.port, name="ours-lora", vision=False)
    try:
        time.sleep(args.settle_s)
        base = asyncio.run(text_run(server, model, args.concurrency, requests, args.max_tokens))
        emit({"models": "base", **base})
        spread = [f"{model}:{name}" for name in names]
        over = asyncio.run(text_run(server, spread, args.concurrency, requests, args.max_tokens))
        emit({"models": f"{len(names)} adapters", **over})
        emit({"adapters_over_base_tok_s": round(over["output_tok_s"] / base["output_tok_s"], 2)})
    finally:
        server.stop()
    for line in Path(server.log.name).read_text(errors="replace").splitlines():
        if "LoRA adapter" in line:
            print(line)

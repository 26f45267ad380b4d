"""Side-by-side benchmark: this service (`serve run`) and a peer on the same model, prompts and
machine: `transformers serve --continuous-batching`, or `llama-server` (a build of yours) on the
same GGUF file, slots, KV cells and threads. Prints one JSON line per configuration.

    ./scripts/bench.sh                       # setup, then this subcommand with its defaults
    .venv/bin/python -m scripts.bench serve --skip-peer --concurrency 1 8
    .venv/bin/python -m scripts.bench serve --workloads text --decoder-replicas 1   # one CPU decoder
    .venv/bin/python -m scripts.bench serve --workloads text --concurrency 1 8 \
        --engines llama.cpp transformers --peer llama-server --llama-server PATH/llama-server

Text: streaming chat at each concurrency (default 1, 8, 16), `--max-tokens` new tokens, greedy;
output tokens/s, TTFT and end-to-end latency p50/p95, for this service on each of `--engines` (one
service after the other) and for the peer, and the ratios of each engine to the peer and to the
first engine.
Images (this service only; the peer drops images): captions/s at concurrency 8 with distinct
images, with captioner batching on and off, and with the caption cache cold and warm. The decoder
replicas' resident memory is read from their processes, the peer's from its process.

The captioner defaults to a small LLaVA built locally (random weights, but the compute of a real
small captioner: a 224 px ViT and a 12-layer LM); pass `--captioner DIR` for a real one.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml
from httpx2 import Limits  # the openai client's own transport library
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from scripts.bench.common import (
    PROMPTS,
    ROOT,
    Endpoint,
    Server,
    arguments,
    closed_loop,
    emit,
    image_url,
    pct,
    primary_name,
    start_llama_server,
    start_ours,
    start_peer,
    streamed_chat,
    write_models,
)

# ----------------------------------------------------------------------------- workloads


async def one_chat(client: AsyncOpenAI, model: str, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    """(time to the first token, the whole request's time, completion tokens)."""
    timing = await streamed_chat(client, model, prompt, max_tokens)
    ttft = timing.first - timing.start if timing.first else float("nan")
    return ttft, timing.end - timing.start, timing.tokens


async def text_run(
    server: Endpoint, model: str | list[str], concurrency: int, requests: int, max_tokens: int
) -> dict[str, Any]:
    """`requests` greedy chats, `concurrency` at a time; over several models, request i names
    the i-th modulo their count.
    """
    models = [model] if isinstance(model, str) else model
    # A new connection per request: llama-server closes a kept-alive connection after a few requests,
    # and a request sent on it as it closes fails. Both servers get the same client.
    client = AsyncOpenAI(
        base_url=server.base_url + "/v1",
        api_key="bench",
        max_retries=0,
        timeout=600,
        http_client=DefaultAsyncHttpxClient(limits=Limits(max_keepalive_connections=0)),
    )
    # Warm-up, 4 at once: every decoder replica answers one before the run (its first step is slow)
    await asyncio.gather(*(one_chat(client, models[i % len(models)], "Say hello.", 8) for i in range(4)))
    queue = list(range(requests))
    results: list[tuple[float, float, int]] = []

    async def worker() -> None:
        while queue:
            i = queue.pop()
            results.append(await one_chat(client, models[i % len(models)], PROMPTS[i % len(PROMPTS)], max_tokens))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    ttfts, e2es = [r[0] for r in results], [r[1] for r in results]
    return {
        "server": server.name,
        "workload": "text",
        "concurrency": concurrency,
        "requests": requests,
        "output_tok_s": round(sum(r[2] for r in results) / wall, 1),
        "ttft_p50_s": round(statistics.median(ttfts), 3),
        "ttft_p95_s": pct(ttfts, 0.95),
        "e2e_p50_s": round(statistics.median(e2es), 2),
        "e2e_p95_s": pct(e2es, 0.95),
    }


async def engine_run(
    concurrency: list[int], rounds: int, max_tokens: int, quantization: str | None, engine_name: str | None
) -> None:
    """The decoder engine alone, in this process (no Serve, no HTTP): what the service's own layers cost.
    `engine_name`: models.yaml's when None (`auto`: llama.cpp for the shipped GGUF, as on a CPU replica).
    """
    from deployments.config import load_models_file
    from deployments.engines import create_text_engine
    from deployments.protocol.replica import GenerateRequest, TextMessage

    model = load_models_file(ROOT / "models.yaml").models[0]
    params = model.params.model_copy(update={"quantization": quantization or model.params.quantization})
    engine = create_text_engine(model.model_copy(update={"params": params, "engine": engine_name or model.engine}))

    async def one(prompt: str) -> tuple[float, float, int]:
        start, ttft, tokens = time.perf_counter(), None, 0
        request = GenerateRequest(
            messages=[TextMessage(role="user", content=prompt)], max_tokens=max_tokens, temperature=0
        )
        async for piece in engine.generate(request):
            ttft = ttft or time.perf_counter() - start
            tokens = piece.completion_tokens
        return ttft or float("nan"), time.perf_counter() - start, tokens

    await one("Say hello.")
    for c in concurrency:
        results, wall = await closed_loop(one, c, rounds)
        emit(
            {
                "server": "engine-in-process",
                "concurrency": c,
                "output_tok_s": round(sum(r[2] for r in results) / wall, 1),
                "ttft_p50_s": round(statistics.median(r[0] for r in results), 3),
            }
        )
    engine.close()


async def image_run(server: Server, model: str, seeds: list[int], concurrency: int, label: dict) -> dict[str, Any]:
    """Image requests (one image each, 1 output token: the caption is the work), `concurrency` at a time.
    A first round of other images warms the captioner up (first passes at each batch shape are slow).
    """
    if label["cache_state"] == "cold":
        await image_run(server, model, [-1 - s for s in seeds[:concurrency]], concurrency, {"cache_state": "warm-up"})
    async with httpx.AsyncClient(base_url=server.base_url, timeout=600) as http:
        queue = list(seeds)
        degraded = 0

        async def worker() -> None:
            nonlocal degraded
            while queue:
                url = image_url(queue.pop())
                body = {
                    "model": model,
                    "max_tokens": 1,
                    "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
                }
                response = await http.post("/v1/chat/completions", json=body)
                response.raise_for_status()
                degraded += "x-vision-degraded" in response.headers

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
        captioner = (await http.get("/health")).json()["components"]["captioner"]
    return {
        "server": server.name,
        "workload": "images",
        **label,
        "concurrency": concurrency,
        "images": len(seeds),
        "captions_s": round(len(seeds) / wall, 2),
        "degraded": degraded,
        "cache": captioner["cache"],
        "last_batch_sizes": captioner["details"].get("last_batch_sizes"),
    }


def decoder_memory() -> dict[str, Any]:
    """Resident memory of every decoder replica process (Ray titles them by deployment)."""
    rss = [
        p.memory_info().rss // 2**20
        for p in psutil.process_iter(["cmdline"])
        if (p.info["cmdline"] or [""])[0].startswith("ray::ServeReplica:default:PrimaryDecoder")
    ]
    return {"decoder_replicas": len(rss), "decoder_rss_mb": sum(rss), "decoder_rss_mb_each": rss}


# ----------------------------------------------------------------------------- setup


def peer_model_dir(cache: Path) -> Path:
    """The same weights as our default (the GGUF, dequantized), saved where `transformers serve` loads them."""
    out = cache / "smollm2-hf"
    if not (out / "config.json").exists():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        primary = yaml.safe_load((ROOT / "models.yaml").read_text())["models"][0]
        source, gguf = ROOT / primary["local_path"], primary["weight_file"]
        AutoTokenizer.from_pretrained(source, gguf_file=gguf).save_pretrained(out)
        loaded = AutoModelForCausalLM.from_pretrained(source, gguf_file=gguf)
        config = loaded.config
        del config.quantization_config  # the GGUF was dequantized on load: save plain weights
        plain = AutoModelForCausalLM.from_config(config)
        plain.load_state_dict(loaded.state_dict())
        plain.generation_config = loaded.generation_config
        plain.save_pretrained(out)
    return out


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def llama_server_layout(models_file: Path) -> dict[str, Any]:
    """The llama.cpp engine's layout for the primary of `models_file` (slots, KV cells and whether
    they are one pool, the threads of one-token and of batched steps of one replica with every core),
    for a peer that runs the same (its -t and -tb).
    """
    from deployments.config import load_models_file
    from deployments.engines.llamacpp.engine import DEFAULT_CONTEXT, gguf_path
    from deployments.engines.llamacpp.gguf_meta import describe_gguf
    from deployments.engines.llamacpp.kv_cache import kv_cache_type, kv_layout
    from deployments.engines.llamacpp.settings import llama_threads

    model = load_models_file(models_file).models[0]
    params = model.params if model.params.cpu_threads else model.params.model_copy(update={"cpu_threads": "all"})
    threads, threads_batch = llama_threads(params)  # one replica with every core, as the engine on CPU
    path = gguf_path(model)
    shape = describe_gguf(path)
    own_len = shape.context_length or DEFAULT_CONTEXT
    cells, unified = kv_layout(
        model.params,
        min(model.params.max_model_len or own_len, own_len),
        shape.kv_bytes_per_token(kv_cache_type(model.params)),
    )
    return {
        "gguf": path,
        "slots": model.params.max_num_seqs,
        "cells": cells,
        "unified": unified,
        "threads": threads,
        "threads_batch": threads_batch,
    }


def main(argv: list[str] | None = None) -> None:
    asyncio.run(bench(argv))


async def bench(argv: list[str] | None) -> None:
    parser = arguments("serve", __doc__)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="requests per concurrency slot (at least 4 in all)")
    parser.add_argument("--image-rounds", type=int, default=4, help="distinct images per slot at concurrency 8")
    parser.add_argument("--captioner", type=Path, help="captioner model directory (default: a tiny LLaVA)")
    parser.add_argument("--workloads", nargs="+", choices=["text", "images"], default=["text", "images"])
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument("--peer", choices=["transformers-serve", "llama-server"], default="transformers-serve")
    parser.add_argument("--llama-server", type=Path, help="the llama-server binary (--peer llama-server)")
    parser.add_argument("--decoder-replicas", type=int, default=0, help="decoders on CPU (default: as shipped, auto)")
    parser.add_argument(
        "--engines", nargs="+", default=[None], help="our decoder's engines, one service each (default: models.yaml's)"
    )
    parser.add_argument("--quantization", help="our decoder's quantization (transformers; default: models.yaml's)")
    parser.add_argument("--params", type=json.loads, default={}, help="overrides of our primary's params (JSON)")
    parser.add_argument("--peer-dtype", default="auto", help="the peer's --dtype (auto: the checkpoint's, float32)")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--engine-only", action="store_true", help="only the decoder engine, in this process")
    args = parser.parse_args(argv)
    if args.engine_only:
        await engine_run(args.concurrency, args.rounds, args.max_tokens, args.quantization, args.engines[0])
        return

    work = ROOT / "models" / "bench"
    work.mkdir(parents=True, exist_ok=True)
    captioner = args.captioner
    if captioner is None:
        from scripts.bench.tiny_models import SMALL_VLM, build_tiny_vlm

        captioner = build_tiny_vlm(work / "small-vlm", SMALL_VLM)
    emit(
        {
            "bench": "start",
            "date": time.strftime("%Y-%m-%d %H:%M"),
            "machine": machine(),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
            | {"captioner": str(captioner)},
        }
    )
    model = primary_name()
    text, images = "text" in args.workloads, "images" in args.workloads
    ours: dict[str, dict[int, dict]] = {}  # engine -> concurrency -> record
    for engine in args.engines:
        name = f"ours-{engine}" if engine else "ours"
        models_file = write_models(work, captioner, max_batch_size=8, engine=engine, params=args.params)
        server = start_ours(models_file, args.port, args.decoder_replicas, args.quantization, name=name)
        try:
            if text:
                ours[name] = {}
                for c in args.concurrency:
                    ours[name][c] = await text_run(server, model, c, max(4, c * args.rounds), args.max_tokens)
                    emit(ours[name][c])
            emit({"server": name, **decoder_memory()})
            if images:
                seeds = list(range(8 * args.image_rounds))
                emit(await image_run(server, model, seeds, 8, {"batching": True, "cache_state": "cold"}))
                emit(await image_run(server, model, seeds, 8, {"batching": True, "cache_state": "warm"}))
        finally:
            server.stop()

    if images:
        server = start_ours(write_models(work, captioner, max_batch_size=1, engine=args.engines[0]), args.port)
        try:
            seeds = list(range(1000, 1000 + 8 * args.image_rounds))
            emit(await image_run(server, model, seeds, 8, {"batching": False, "cache_state": "cold"}))
        finally:
            server.stop()
    if not text:
        return

    first = next(iter(ours.values()))
    for name, records in list(ours.items())[1:]:
        emit({"ratio": f"{next(iter(ours))}/{name}", **ratios(first, records)})
    if 1 in first:
        emit(
            {
                "ratio": "ours c/c1",
                **{f"c{c}": round(first[c]["output_tok_s"] / first[1]["output_tok_s"], 2) for c in first},
            }
        )
    if args.skip_peer:
        return

    if args.peer == "llama-server":
        if args.llama_server is None:
            raise SystemExit("--peer llama-server needs --llama-server PATH (a llama-server binary)")
        layout = llama_server_layout(models_file)
        server = start_llama_server(args.llama_server, args.port + 1, **layout)
        peer_model = layout["gguf"].name
    else:
        server = start_peer(peer_model_dir(work), args.port + 1, args.peer_dtype)
        peer_model = str(peer_model_dir(work))
    peer: dict[int, dict] = {}
    try:
        for c in args.concurrency:
            peer[c] = await text_run(server, peer_model, c, max(4, c * args.rounds), args.max_tokens)
            emit(peer[c])
        emit({"server": server.name, "rss_mb": psutil.Process(server.proc.pid).memory_info().rss // 2**20})
    finally:
        server.stop()
    for name, records in ours.items():
        emit({"ratio": f"{name}/{server.name}", **ratios(records, peer)})


def ratios(ours: dict[int, dict], peer: dict[int, dict]) -> dict[str, Any]:
    """Tokens/s and TTFT p50 of `ours` over `peer`, at each concurrency both ran."""
    return {
        f"c{c}": {
            "output_tok_s": round(ours[c]["output_tok_s"] / peer[c]["output_tok_s"], 2),
            "ttft_p50": round(ours[c]["ttft_p50_s"] / peer[c]["ttft_p50_s"], 2),
        }
        for c in ours
        if c in peer
    }

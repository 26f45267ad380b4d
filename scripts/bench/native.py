"""Native vision benchmark: requests/s and time to first token of image chats at concurrency 1 and 8,
the batched path (`max_num_seqs` 8: static batches of up to 8) against one request at a time
(`max_num_seqs` 1), side by side in one run, through real Serve and HTTP with the openai client.

The model is a VLM built locally (random weights, no hub): `tiny_models.SMALL_VLM` by default (a
224 px ViT and a 12-layer 576-wide LM, the compute of a real small VLM), or `--shape tiny`. Each
request carries its own image (no processor-cache hits) and asks for `--max-tokens` greedy tokens.
Prints one JSON line per configuration and concurrency, then the ratio of batched to one-at-a-time
throughput at the highest concurrency.

    HF_HUB_OFFLINE=1 .venv/bin/python -m scripts.bench native [--requests 16] [--max-tokens 32]

`--engine llama.cpp`: a GGUF VLM on the llama.cpp engine alone, in this process (no Serve, no HTTP):
the offline SmolLM2 GGUF with a random LLaVA-style projector (`tiny_models.SMALL_MMPROJ`: a 224 px
ViT, 49 image tokens per image; `--shape tiny`: 16), `max_num_seqs` 8, requests with their own image
at each concurrency, and the ratio of requests/s at the highest concurrency to concurrency 1.

    .venv/bin/python -m scripts.bench native --engine llama.cpp [--requests 16] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import ray
import yaml
from openai import AsyncOpenAI
from ray import serve

from deployments.app import build_app
from scripts.bench.common import arguments, image_url
from scripts.bench.tiny_models import (
    SMALL_MMPROJ,
    SMALL_VLM,
    SMOLLM2_FILE,
    TINY_MMPROJ,
    TINY_MMPROJ_FILE,
    TINY_VLM,
    build_tiny_gguf_vlm,
    build_tiny_vlm,
)

MODEL = "bench-vlm"


def models_file(directory: Path, model_dir: Path, max_num_seqs: int, max_model_len: int) -> Path:
    entry = {
        "name": MODEL,
        "local_path": str(model_dir),
        "params": {
            "max_num_seqs": max_num_seqs,
            "max_model_len": max_model_len,
            "temperature": 0,
            "cpu_threads": "all",
            "batch_wait_ms": 10,
            "stream_interval_ms": 150,  # as the shipped CPU entry: fewer Serve messages per token
        },
        "capabilities": {"vision_mode": "native", "max_images_per_request": 1},
        "deployment": {"max_ongoing_requests": 16},
    }
    path = directory / f"models-seqs{max_num_seqs}.yaml"
    path.write_text(yaml.safe_dump({"models": [entry]}))
    return path


async def one(client: AsyncOpenAI, seed: int, max_tokens: int) -> tuple[float, float, int]:
    start, ttft = time.perf_counter(), None
    content = [
        {"type": "text", "text": "Describe this picture."},
        {"type": "image_url", "image_url": {"url": image_url(seed)}},
    ]
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],  # type: ignore[list-item,misc]
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    tokens = 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and ttft is None:
            ttft = time.perf_counter() - start
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return ttft or float("nan"), time.perf_counter() - start, tokens


async def closed_run(
    one: Callable[[int], Awaitable[tuple[float, float, int]]], concurrency: int, requests: int, first_seed: int
) -> dict[str, Any]:
    """`requests` requests (image seeds from `first_seed`), `concurrency` at a time: their rates and medians."""
    seeds = list(range(first_seed, first_seed + requests))
    results: list[tuple[float, float, int]] = []

    async def worker() -> None:
        while seeds:
            results.append(await one(seeds.pop()))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "requests_per_s": round(len(results) / wall, 3),
        "output_tok_s": round(sum(r[2] for r in results) / wall, 1),
        "ttft_p50_s": round(statistics.median(r[0] for r in results), 3),
        "latency_p50_s": round(statistics.median(r[1] for r in results), 3),
    }


async def run(client: AsyncOpenAI, concurrency: int, requests: int, max_tokens: int, first_seed: int) -> dict:
    return await closed_run(lambda seed: one(client, seed, max_tokens), concurrency, requests, first_seed)


async def bench(args: argparse.Namespace, model_dir: Path, work: Path) -> list[dict[str, Any]]:
    records = []
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{args.port}/v1", api_key="unused", max_retries=0, timeout=600)
    seed = 0
    for label, seqs in (("batched", 8), ("one-at-a-time", 1)):
        path = models_file(work, model_dir, seqs, args.max_model_len)
        started = time.perf_counter()
        serve.run(build_app({"models_file": str(path), "decoder_cpu_replicas": 1}), name="default", route_prefix="/")
        load_s = round(time.perf_counter() - started, 1)
        health = httpx.get(f"http://127.0.0.1:{args.port}/health", timeout=30).json()
        profile = health["components"]["decoder"]["details"]["memory_profile"]
        print(json.dumps({"path": label, "memory_profile": profile}), flush=True)
        await one(client, 10_000, 2)  # warm-up
        for concurrency in args.concurrency:
            record = {"path": label, "max_num_seqs": seqs, "load_s": load_s}
            record |= await run(client, concurrency, args.requests, args.max_tokens, seed)
            seed += args.requests
            print(json.dumps(record), flush=True)
            records.append(record)
        serve.delete("default")
    return records


async def bench_llamacpp(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """The GGUF VLM on the llama.cpp engine alone (see the module's docstring)."""
    import base64
    import hashlib

    from deployments.config import ModelConfig
    from deployments.engines import create_text_engine
    from deployments.protocol.replica import GenerateRequest, ImageBytes, MessageImage, MessageText, TextMessage

    folder = build_tiny_gguf_vlm(work / "gguf-vlm", SMALL_MMPROJ if args.shape == "small" else TINY_MMPROJ)
    started = time.perf_counter()
    engine = create_text_engine(
        ModelConfig.model_validate(
            {
                "name": MODEL,
                "engine": "llama.cpp",
                "local_path": str(folder),
                "weight_file": SMOLLM2_FILE,
                "mmproj_file": TINY_MMPROJ_FILE,
                "params": {
                    "max_num_seqs": 8,
                    "max_model_len": args.max_model_len,
                    "temperature": 0,
                    "cpu_threads": args.threads or "all",
                },
                "capabilities": {"vision_mode": "native", "max_images_per_request": 1},
            }
        )
    )
    load_s = round(time.perf_counter() - started, 1)
    text = "Describe this picture."

    async def one(seed: int) -> tuple[float, float, int]:
        data = base64.b64decode(image_url(seed).split(",", 1)[1])
        request = GenerateRequest(
            messages=[TextMessage(role="user", content=text, parts=[MessageText(text=text), MessageImage(index=0)])],
            images=[ImageBytes(data=data, sha256=hashlib.sha256(data).hexdigest())],
            max_tokens=args.max_tokens,
        )
        start, ttft, tokens = time.perf_counter(), None, 0
        async for piece in engine.generate(request):
            ttft = ttft or time.perf_counter() - start
            tokens = piece.completion_tokens
        return ttft or float("nan"), time.perf_counter() - start, tokens

    records = []
    seed = 0
    try:
        await one(10_000)  # warm-up
        for concurrency in args.concurrency:
            measured = await closed_run(one, concurrency, args.requests, seed)
            seed += args.requests
            record = {
                "path": "llama.cpp engine",
                "max_num_seqs": 8,
                "threads": engine.cpu_threads,
                "max_tokens": args.max_tokens,
                "load_s": load_s,
                "image_tokens_per_image": engine.describe()["image_tokens"]["per_image"],
                **measured,
            }
            print(json.dumps(record), flush=True)
            records.append(record)
    finally:
        engine.close()
    return records


def main(argv: list[str] | None = None) -> None:
    parser = arguments("native", __doc__)
    parser.add_argument("--shape", choices=["small", "tiny"], default="small")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--requests", type=int, default=16, help="requests per concurrency level")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=256)
    parser.add_argument("--port", type=int, default=8772)
    parser.add_argument("--engine", choices=["transformers", "llama.cpp"], default="transformers")
    parser.add_argument("--threads", type=int, help="--engine llama.cpp: its threads (default: every core)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-native-"))
    if args.engine == "llama.cpp":
        records = asyncio.run(bench_llamacpp(args, work))
        rate = {r["concurrency"]: r["requests_per_s"] for r in records}
        top, low = max(rate), min(rate)
        ratio = round(rate[top] / rate[low], 2) if rate[low] else None
        print(json.dumps({"engine": "llama.cpp", "shape": args.shape, f"c{top}_over_c{low}": ratio}), flush=True)
        return
    model_dir = build_tiny_vlm(work / "vlm", SMALL_VLM if args.shape == "small" else TINY_VLM)
    # The replicas get the builder's environment (`REPLICA_ENV`: OpenMP threads that sleep, so the proxy
    # and the ingress get a core on a small machine; bounded oneDNN caches): serve_config.yaml has none.
    ray.init(address="local", include_dashboard=False, logging_level="ERROR")
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    try:
        records = asyncio.run(bench(args, model_dir, work))
    finally:
        serve.shutdown()
        ray.shutdown()
    top = max(args.concurrency)
    rate = {r["path"]: r["requests_per_s"] for r in records if r["concurrency"] == top}
    summary = {"shape": args.shape, "concurrency": top, "batched_over_one_at_a_time": None}
    if rate.get("one-at-a-time"):
        summary["batched_over_one_at_a_time"] = round(rate["batched"] / rate["one-at-a-time"], 2)
    print(json.dumps(summary), flush=True)

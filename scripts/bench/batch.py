"""Batch jobs beside interactive requests, through the service as shipped (its primary, no vision).

Three measurements:

1. throughput: `--lines` chat lines (one short user turn each, greedy, EOS biased away so every answer
   runs to `--max-tokens`) sent by an OpenAI client at `--concurrency`, then other lines of the same
   shape as one batch (Files and Batch APIs; the runner sends `--concurrency` lines at once): completion
   tokens over the wall time of each (the batch's from `batches.create` to `completed`), and their ratio;
2. interactive beside a batch: `--interactive` streamed chats one at a time, their time to first token
   on the idle service, then again while a batch runs (cancelled after them);
3. the runner killed mid-batch (a batch of `--kill-lines`, killed at `--kill-at` of them done): its
   replica killed as a crash would (`ray.kill`), Serve replaces it, the batch resumes; each
   custom_id's count across the output and error files (every one exactly once: none lost, none
   twice).

    .venv/bin/python -m scripts.bench batch
    .venv/bin/python -m scripts.bench batch --lines 40 --interactive 4  # a smoke run
    .venv/bin/python -m scripts.bench batch --only beside --lines 150 --interactive 20

Every line and chat starts with its own nonce, so no run reuses another's cached prefix. Prints one
JSON line per measurement.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from openai import AsyncOpenAI, OpenAI

from scripts.bench.common import arguments, emit, start_ours, streamed_chat
from scripts.bench.prompts import NO_EOS, models_file, prompt_text
from scripts.bench.serve import machine

FINAL = {"completed", "failed", "expired", "cancelled"}
PROMPT_WORDS = 24  # each line's prompt: about 60 tokens with the chat template


def lines(tag: str, count: int, max_tokens: int, model: str) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"{tag}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": prompt_text(PROMPT_WORDS, f"{tag}-{i}")}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "logit_bias": NO_EOS,
            },
        }
        for i in range(count)
    ]


async def by_client(base_url: str, requests: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="bench", max_retries=0, timeout=1200)
    queue, tokens = list(reversed(requests)), 0

    async def worker() -> None:
        nonlocal tokens
        while queue:
            answer = await client.chat.completions.create(**queue.pop()["body"])
            tokens += answer.usage.completion_tokens if answer.usage else 0

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    return {"mode": f"client c{concurrency}", "lines": len(requests), "tokens": tokens, "wall_s": round(wall, 1)}


def submit(client: OpenAI, requests: list[dict[str, Any]]) -> str:
    body = "".join(json.dumps(line) + "\n" for line in requests).encode()
    upload = client.files.create(file=("lines.jsonl", body), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    return batch.id


def as_batch(client: OpenAI, requests: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
    start = time.perf_counter()
    batch_id = submit(client, requests)
    while (batch := client.batches.retrieve(batch_id)).status not in FINAL:
        time.sleep(0.25)
    wall = time.perf_counter() - start
    if batch.status != "completed" or not batch.output_file_id:
        raise SystemExit(f"batch {batch_id} ended {batch.status}: {batch.errors}")
    output = client.files.content(batch.output_file_id).text.splitlines()
    tokens = sum(json.loads(line)["response"]["body"]["usage"]["completion_tokens"] for line in output)
    counts = batch.request_counts.model_dump() if batch.request_counts else {}
    return {
        "mode": f"batch ({concurrency} lines at once)",
        "lines": len(requests),
        "tokens": tokens,
        "wall_s": round(wall, 1),
        "request_counts": counts,
    }


async def interactive(base_url: str, model: str, count: int, tag: str, max_tokens: int) -> list[float]:
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="bench", max_retries=0, timeout=600)
    ttfts = []
    for i in range(count):
        timing = await streamed_chat(client, model, prompt_text(PROMPT_WORDS, f"{tag}-{i}"), max_tokens)
        ttfts.append((timing.first or timing.end) - timing.start)
    return ttfts


def beside_a_batch(client: OpenAI, base_url: str, model: str, args: Any) -> dict[str, Any]:
    idle = asyncio.run(interactive(base_url, model, args.interactive, "idle", args.max_tokens))
    batch_id = submit(client, lines("load", args.lines, args.max_tokens, model))
    while (batch := client.batches.retrieve(batch_id)).status != "in_progress" or not (
        batch.request_counts and batch.request_counts.completed
    ):
        if batch.status in FINAL:
            raise SystemExit(f"batch {batch_id} ended {batch.status} before the interactive chats")
        time.sleep(0.25)
    busy = asyncio.run(interactive(base_url, model, args.interactive, "busy", args.max_tokens))
    during = client.batches.retrieve(batch_id)
    client.batches.cancel(batch_id)
    p50_idle, p50_busy = statistics.median(idle), statistics.median(busy)
    return {
        "mode": "interactive c1",
        "chats": args.interactive,
        "ttft_p50_idle_s": round(p50_idle, 3),
        "ttft_p50_beside_batch_s": round(p50_busy, 3),
        "ratio": round(p50_busy / p50_idle, 2),
        "ttft_idle_s": [round(t, 3) for t in idle],
        "ttft_beside_batch_s": [round(t, 3) for t in busy],
        "batch_still_running": during.status == "in_progress",
        "batch_lines_done_by_then": during.request_counts.completed if during.request_counts else None,
    }


def killed_mid_batch(client: OpenAI, model: str, args: Any) -> dict[str, Any]:
    import ray

    start = time.perf_counter()
    batch_id = submit(client, lines("resume", args.kill_lines, args.max_tokens, model))
    while (batch := client.batches.retrieve(batch_id)).request_counts is None or (
        batch.request_counts.completed < args.kill_at * args.kill_lines
    ):
        time.sleep(0.25)
    done_at_kill = batch.request_counts.completed
    ray.init(address="auto", namespace="serve", logging_level="ERROR")
    try:
        runners = [a for a in ray.util.list_named_actors(all_namespaces=True) if "#BatchRunner#" in a["name"]]
        for actor in runners:
            ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
    finally:
        ray.shutdown()
    while (batch := client.batches.retrieve(batch_id)).status not in FINAL:
        time.sleep(0.5)
    seen: dict[str, int] = {}
    for file_id in (batch.output_file_id, batch.error_file_id):
        for line in client.files.content(file_id).text.splitlines() if file_id else []:
            custom_id = json.loads(line)["custom_id"]
            seen[custom_id] = seen.get(custom_id, 0) + 1
    wanted = {line["custom_id"] for line in lines("resume", args.kill_lines, args.max_tokens, model)}
    return {
        "mode": "runner killed mid-batch",
        "lines": args.kill_lines,
        "done_when_killed": done_at_kill,
        "runners_killed": len(runners),
        "status": batch.status,
        "lost": len(wanted - seen.keys()),
        "twice_or_more": sum(count > 1 for count in seen.values()),
        "wall_s": round(time.perf_counter() - start, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = arguments("batch", __doc__)
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8, help="the client's, and the runner's lines at once")
    parser.add_argument("--interactive", type=int, default=10, help="chats one at a time, idle and beside a batch")
    parser.add_argument("--kill-lines", type=int, default=300, help="lines of the batch whose runner is killed")
    parser.add_argument("--kill-at", type=float, default=0.3, help="share of lines done when the runner is killed")
    parser.add_argument("--settle-s", type=float, default=10)
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument(
        "--only", choices=["throughput", "beside", "killed"], help="run one of the three measurements, not all"
    )
    args = parser.parse_args(argv)
    emit({"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S")})
    work = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    path = models_file(work, invariant=False)
    models = yaml.safe_load(path.read_text())
    models.setdefault("server", {})["state"] = {"storage_root": str(work / "storage")}
    models["server"]["batches"] = {
        "max_concurrency": args.concurrency,
        "poll_interval_s": 0.25,
    }
    path.write_text(yaml.safe_dump(models))
    model = models["models"][0]["name"]
    server = start_ours(path, args.port, name="ours-batch", vision=False)
    try:
        time.sleep(args.settle_s)
        asyncio.run(by_client(server.base_url, lines("warm", 8, 4, model), 8))
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="bench", max_retries=0, timeout=600)
        if args.only in (None, "throughput"):
            direct = asyncio.run(
                by_client(server.base_url, lines("client", args.lines, args.max_tokens, model), args.concurrency)
            )
            emit({**direct, "tok_s": round(direct["tokens"] / direct["wall_s"], 1)})
            batched = as_batch(client, lines("batch", args.lines, args.max_tokens, model), args.concurrency)
            emit({**batched, "tok_s": round(batched["tokens"] / batched["wall_s"], 1)})
            ratio = (batched["tokens"] / batched["wall_s"]) / (direct["tokens"] / direct["wall_s"])
            emit({"batch_over_client_tok_s": round(ratio, 2)})
        if args.only in (None, "beside"):
            emit(beside_a_batch(client, server.base_url, model, args))
        if args.only in (None, "killed"):
            emit(killed_mid_batch(client, model, args))
    finally:
        server.stop()

"""Fair share between API keys (issues 60 and 67), on the offline default (models.yaml's primary alone,
llama.cpp on the CPU): key B's time to first token, one request at a time, while key A keeps
`max_num_seqs - 1` requests in flight (a full batch and no queue) and while it keeps 3x
`max_num_seqs` in flight (a queue twice the batch); with a limits file that names both keys and
sets no share (the default: fair queueing, and a sequence held back from a key that runs for a key
that runs none), the same with each key's `max_slot_share: 1` (every sequence: fair queueing alone,
the default before issue 67), with each key capped to `max_num_seqs - 1` sequences (`max_slot_share`),
and without a limits file (one queue, first come first served), one service after the other. Then
the limits' own cost at concurrency 1: a one-token chat's p50 with and without the limits file, and
the ingress's `mmserve_key_admission_seconds` (the board's round trip) from Ray's metrics export.

    .venv/bin/python -m scripts.bench fairness            # --samples 12 --max-tokens 64 --settings fair whole none

Prints one JSON line per measurement, and B's ratio of full-queue to full-batch TTFT per setting.
"""

from __future__ import annotations

import asyncio
import hashlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from httpx import Limits
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from scripts.bench.common import arguments, emit, pct, start_ours, streamed_chat
from scripts.bench.overhead import decoder_models
from scripts.bench.serve import machine

KEY_A, KEY_B = "sk-bench-key-a-0123456789", "sk-bench-key-b-0123456789"


def limits_file(directory: Path, share: float | None) -> Path:
    """Both keys named, with limits far above what the run asks: every request goes through the board
    (its cost is measured), none is refused (what is measured is the decoders' fair share); `share`:
    each key's `max_slot_share`.
    """
    limits: dict[str, Any] = {"requests_per_minute": 1_000_000, "tokens_per_minute": 1_000_000_000}
    if share is not None:
        limits["max_slot_share"] = share
    keys = [
        {"name": name, "key_sha256": hashlib.sha256(key.encode()).hexdigest(), **limits}
        for name, key in (("a", KEY_A), ("b", KEY_B))
    ]
    path = directory / f"limits-{share}.yaml"
    path.write_text(yaml.safe_dump({"keys": keys}))
    return path


def client(base_url: str, key: str) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=base_url + "/v1",
        api_key=key,
        max_retries=0,
        timeout=900,
        http_client=DefaultAsyncHttpxClient(limits=Limits(max_connections=200, max_keepalive_connections=0)),
    )


async def flood(a: AsyncOpenAI, model: str, in_flight: int, max_tokens: int, stop: asyncio.Event) -> None:
    """Key A keeps `in_flight` chats going until `stop`."""

    async def one_slot(i: int) -> None:
        n = 0
        while not stop.is_set():
            await streamed_chat(a, model, f"Write a long story about ship {i}-{n}.", max_tokens)
            n += 1

    await asyncio.gather(*(one_slot(i) for i in range(in_flight)))


async def b_ttfts(b: AsyncOpenAI, model: str, samples: int) -> list[float]:
    ttfts = []
    for i in range(samples):
        timing = await streamed_chat(b, model, f"Say a short greeting number {i}.", 8)
        ttfts.append((timing.first or timing.end) - timing.start)
        await asyncio.sleep(0.5)
    return ttfts


async def under_load(base_url: str, model: str, in_flight: int, samples: int, max_tokens: int) -> list[float]:
    a, b = client(base_url, KEY_A), client(base_url, KEY_B)
    stop = asyncio.Event()
    load = asyncio.create_task(flood(a, model, in_flight, max_tokens, stop))
    await asyncio.sleep(max(5.0, in_flight * 0.25))  # A's requests all sent and its queue formed
    try:
        return await b_ttfts(b, model, samples)
    finally:
        stop.set()
        await load


async def one_token_p50(base_url: str, model: str, rounds: int) -> float:
    b = client(base_url, KEY_B)
    times = []
    for i in range(rounds):
        start = time.perf_counter()
        await b.chat.completions.create(model=model, messages=[{"role": "user", "content": f"Hi {i}"}], max_tokens=1)
        times.append(time.perf_counter() - start)
    return statistics.median(times[5:])


def admission_seconds() -> dict[str, float]:
    """The ingress's admission histogram from Ray's metrics export (its port in the newest Ray
    session's files, once the export has caught up): count, mean, and the share at or under 2 ms.
    """
    time.sleep(15)
    port = next(Path("/tmp/ray/session_latest").glob("metrics_export_port_*")).read_text().strip()
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    name = "ray_mmserve_key_admission_seconds"
    total = count = under = 0.0
    for line in text.splitlines():
        if line.startswith(name + "_sum{"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_count{"):
            count += float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_bucket{") and 'le="0.002"' in line:
            under += float(line.rsplit(" ", 1)[1])
    mean_ms = 1000 * total / count if count else float("nan")
    return {"count": count, "mean_ms": round(mean_ms, 3), "share_le_2ms": round(under / count, 3) if count else 0.0}


def main(argv: list[str] | None = None) -> None:
    parser = arguments("fairness", __doc__)
    parser.add_argument("--samples", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=105, help="one-token chats for the limits' cost")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument(
        "--settings",
        nargs="+",
        choices=("fair", "whole", "share", "none"),
        default=["fair", "whole", "none"],
        help="fair: both keys named, no share (the default rule); whole: each key's max_slot_share 1 (fair "
        "queueing alone); share: each capped to max_num_seqs - 1 sequences (max_slot_share); none: no limits "
        "file (one queue, first come first served)",
    )
    args = parser.parse_args(argv)
    emit({"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S")})
    work = Path(tempfile.mkdtemp(prefix="bench-fairness-"))
    models = decoder_models(work, None, None, 0)
    entry = yaml.safe_load(models.read_text())["models"][0]
    model, seqs = entry["name"], entry["params"]["max_num_seqs"]
    results: dict[str, dict[str, Any]] = {}
    for setting in args.settings:
        share = {"share": (seqs - 1) / seqs, "whole": 1.0}.get(setting)
        extra = {"limits_file": str(limits_file(work, share))} if setting != "none" else {}
        server = start_ours(models, args.port, name=f"fairness-{setting}", vision=False, args=extra)
        try:
            url = server.base_url
            asyncio.run(one_token_p50(url, model, 10))  # warm
            p50 = asyncio.run(one_token_p50(url, model, args.rounds))
            emit({"setting": setting, "one_token_p50_ms": round(1000 * p50, 2)})
            results[setting] = {"one_token_p50_s": p50}
            if setting != "none":
                admission = admission_seconds()
                emit({"setting": setting, "admission": admission})
            for load in (seqs - 1, 3 * seqs):
                ttfts = asyncio.run(under_load(url, model, load, args.samples, args.max_tokens))
                p50 = statistics.median(ttfts)
                emit(
                    {
                        "setting": setting,
                        "a_in_flight": load,
                        "b_ttft_p50_s": round(p50, 3),
                        "b_ttft_p90_s": pct(ttfts, 0.9),
                    }
                )
                results[setting][load] = p50
        finally:
            server.stop()
    for setting, found in results.items():
        emit({"setting": setting, "ratio_full_queue_to_full_batch": round(found[3 * seqs] / found[seqs - 1], 2)})
    if "none" in results and "fair" in results:
        added = results["fair"]["one_token_p50_s"] - results["none"]["one_token_p50_s"]
        emit({"limits_added_one_token_p50_ms": round(1000 * added, 2)})


if __name__ == "__main__":
    main()

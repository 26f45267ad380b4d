"""The primary decoder's resident memory over rounds of requests, on the engine alone (no Serve).

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/engine_memory.py --rounds 8
    LRU_CACHE_CAPACITY=16 ONEDNN_PRIMITIVE_CACHE_CAPACITY=16 HF_HUB_OFFLINE=1 .venv/bin/python scripts/engine_memory.py
    heaptrack .venv/bin/python scripts/engine_memory.py      # where the native heap grows

Each round sends `--requests` concurrent chats of varied lengths (so that continuous batching
meets many batch shapes, as under real load), drops one stream in ten after its first piece,
then prints one JSON line: seconds so far, RSS, and the sequences still running or waiting. A leak shows as
RSS that keeps rising round after round; a cache that fills shows as a rise that levels off.
Set the cache variables in the environment, as above: torch reads them once, at start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from contextlib import aclosing
from pathlib import Path

import psutil

from deployments.config import load_models_file
from deployments.engines import TextEngine
from deployments.engines.factory import create_text_engine
from deployments.protocol.replica import GenerateRequest, TextMessage

QUESTIONS = ["What is the capital of Japan?", "Name a fruit that is red.", "Write a haiku about the sea."]


async def one(engine: TextEngine, i: int, max_tokens: int) -> None:
    text = QUESTIONS[i % len(QUESTIONS)] + " Context:" + " stone" * (i * 37 % 150)
    request = GenerateRequest(messages=[TextMessage(role="user", content=text)], max_tokens=max_tokens, temperature=0)
    async with aclosing(engine.generate(request)) as pieces:
        async for _ in pieces:
            if i % 10 == 3:
                return  # a client that drops its stream


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models-file", type=Path, default=Path(__file__).resolve().parents[1] / "models.yaml")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=64, help="per round, all at once")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--cpu-threads", type=int, default=2)
    args = parser.parse_args()
    model = load_models_file(args.models_file).models[0]
    model = model.model_copy(update={"params": model.params.model_copy(update={"cpu_threads": args.cpu_threads})})
    engine = create_text_engine(model)  # inside the running loop: the engine's results come back on it
    process, start = psutil.Process(), time.perf_counter()
    try:
        for r in range(args.rounds):
            await asyncio.gather(*(one(engine, r * args.requests + i, args.max_tokens) for i in range(args.requests)))
            await asyncio.sleep(0.5)
            line = {"round": r, "s": round(time.perf_counter() - start, 1), "rss_mb": process.memory_info().rss >> 20}
            print(json.dumps(line | engine.stats()), flush=True)
    finally:
        engine.close()


if __name__ == "__main__":
    asyncio.run(main())

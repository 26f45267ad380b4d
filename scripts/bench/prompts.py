"""Long prompts: time to first token and decode speed by prompt length and output length, one
streaming request at a time, greedy, for the llama.cpp decoder through Serve in each KV layout
(`batch_invariant` off: f16 cells, shipped; on: q8_0 cells), the same engine alone in this process
(what Serve, HTTP and the ingress add), and a `llama-server` of yours laid out as the engine (slots,
cells, threads). Prints one JSON line per (server, prompt length, output length).

    .venv/bin/python -m scripts.bench prompts --llama-server PATH/llama-server
    .venv/bin/python -m scripts.bench prompts --prompt-tokens 200 --max-tokens 16 --skip-peer  # a smoke run

And a stream's longest gap between chunks while a `--stall-tokens` prompt is read beside it.
Every prompt starts with a nonce, so no cached prefix is reused; EOS is biased away so that every
answer runs to its `max_tokens`. A service is measured after `--settle-s` seconds (the offline
captioner's failed loads start new processes in the first minutes). Decode tok/s counts the tokens
after the first over the time after the first.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import yaml
from openai import AsyncOpenAI

from scripts.bench.common import ROOT, arguments, emit, primary_name, start_llama_server, start_ours, streamed_chat
from scripts.bench.serve import llama_server_layout, machine

WORDS = ["river", "stone", "cloud", "apple", "garden", "window", "silver", "morning", "candle", "forest", "letter"]
WORDS += ["harbor", "meadow", "pepper", "lantern", "valley", "copper", "thunder", "orchard", "violet", "marble"]
NO_EOS = {"0": -100, "2": -100}  # SmolLM2's <|endoftext|> and <|im_end|>

Timed = tuple[float, float, int]  # TTFT, decode tok/s, completion tokens


def prompt_text(tokens: int, nonce: int | str) -> str:
    """About `tokens` tokens of SmolLM2's vocabulary (a token a word here), after a nonce; the chat
    template adds about 30.
    """
    words = itertools.islice(itertools.cycle(WORDS), tokens)
    return f"Request {nonce}. Summarize these words: " + " ".join(words)


def timed(start: float, first: float | None, end: float, tokens: int) -> Timed:
    ttft = (first or end) - start
    decode = (tokens - 1) / (end - first) if first and tokens > 1 and end > first else float("nan")
    return round(ttft, 3), round(decode, 1), tokens


async def over_http(base_url: str, model: str, prompt: str, max_tokens: int) -> Timed:
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", timeout=1200)
    timing = await streamed_chat(client, model, prompt, max_tokens, logit_bias=NO_EOS)
    return timed(timing.start, timing.first, timing.end, timing.tokens)


async def beside_a_long_prompt(base_url: str, model: str, prompt_tokens: int, nonce: itertools.count) -> dict:
    """A short-prompt stream decoding while a `prompt_tokens` prompt arrives: its longest gap between
    two chunks before the long prompt and while it is read (what a reader of that stream sees stall;
    chunks, not tokens: this service coalesces tokens into chunks for `stream_interval_ms`).
    """
    client = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", timeout=1200)
    arrivals: list[float] = []
    long_sent: list[float] = []

    async def stream() -> None:
        answer = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt_text(40, next(nonce))}],
            max_tokens=4000,  # within the context: longer than the long prompt takes to read
            temperature=0,
            logit_bias=NO_EOS,
            stream=True,
        )
        async for chunk in answer:
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append(time.perf_counter())
                if long_sent and long_sent[0] and time.perf_counter() > long_sent[0]:
                    break

    async def long_prompt() -> None:
        await asyncio.sleep(5)
        long_sent.append(0.0)
        timing = await over_http(base_url, model, prompt_text(prompt_tokens, next(nonce)), 1)
        long_sent[0] = time.perf_counter()
        long_sent.append(timing[0])

    await asyncio.wait_for(asyncio.gather(stream(), long_prompt()), 1800)
    start_long = long_sent[0] - long_sent[1]
    gaps = list(itertools.pairwise(arrivals))
    before = [b - a for a, b in gaps if b < start_long]
    during = [b - a for a, b in gaps if b >= start_long]
    return {
        "long_prompt_tokens": prompt_tokens,
        "long_prompt_ttft_s": round(long_sent[1], 2),
        "longest_gap_before_s": round(max(before, default=float("nan")), 2),
        "longest_gap_during_s": round(max(during, default=float("nan")), 2),
        "chunks_during": len(during),
    }


def in_process(models_file: Path) -> tuple[Callable[[str, int], Any], Callable[[], None]]:
    """The llama.cpp engine of `models_file`'s primary in this process: a request function and a closer."""
    from deployments.config import load_models_file
    from deployments.engines import create_text_engine
    from deployments.protocol.replica import GenerateRequest, TextMessage

    engine = create_text_engine(load_models_file(models_file).models[0])

    async def one(prompt: str, max_tokens: int) -> Timed:
        request = GenerateRequest(
            messages=[TextMessage(role="user", content=prompt)],
            max_tokens=max_tokens,
            temperature=0,
            logit_bias={0: -100, 2: -100},
        )
        start, first, tokens = time.perf_counter(), None, 0
        pieces: AsyncIterator = engine.generate(request)
        async for piece in pieces:
            if first is None and piece.text:
                first = time.perf_counter()
            tokens = piece.completion_tokens
        return timed(start, first, time.perf_counter(), tokens)

    return one, engine.close


def models_file(directory: Path, invariant: bool) -> Path:
    """models.yaml's primary alone, without vision, in the layout asked for."""
    models = yaml.safe_load((ROOT / "models.yaml").read_text())
    primary = models["models"][0]
    primary["local_path"] = str((ROOT / primary["local_path"]).resolve())
    primary["params"]["batch_invariant"] = invariant
    primary["capabilities"] = {**primary.get("capabilities", {}), "vision_mode": "disabled"}
    primary["capabilities"].pop("captioner", None)
    models["models"] = [primary]
    path = directory / ("invariant" if invariant else "shipped") / "models.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(models))
    return path


async def measure(name: str, one: Callable[[str, int], Any], args: Any, nonce: itertools.count) -> None:
    await one(prompt_text(32, next(nonce)), 4)  # warm
    for prompt_tokens, max_tokens in itertools.product(args.prompt_tokens, args.max_tokens):
        runs = [await one(prompt_text(prompt_tokens, next(nonce)), max_tokens) for _ in range(args.rounds)]
        emit(
            {
                "server": name,
                "prompt_tokens": prompt_tokens,
                "max_tokens": max_tokens,
                "ttft_s": statistics.median(r[0] for r in runs),
                "decode_tok_s": statistics.median(r[1] for r in runs),
                "completion_tokens": [r[2] for r in runs],
            }
        )


def main(argv: list[str] | None = None) -> None:
    parser = arguments("prompts", __doc__)
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[200, 2000, 6600])
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--rounds", type=int, default=1, help="requests per cell (the median is kept)")
    parser.add_argument("--layouts", nargs="+", choices=["shipped", "invariant"], default=["shipped", "invariant"])
    parser.add_argument("--skip-engine", action="store_true", help="skip the engine alone in this process")
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument("--llama-server", type=Path, help="the llama-server binary")
    parser.add_argument("--settle-s", type=float, default=30)
    parser.add_argument(
        "--stall-tokens",
        type=int,
        default=6600,
        help="a stream's longest gap while a prompt this long is read (0: skip)",
    )
    parser.add_argument("--port", type=int, default=8100)
    args = parser.parse_args(argv)
    if not args.skip_peer and not args.llama_server:
        parser.error("--llama-server PATH, or --skip-peer")
    emit({"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S")})
    nonce = itertools.count()
    work = Path(tempfile.mkdtemp(prefix="bench-prompts-"))
    model = primary_name()
    for layout in args.layouts:
        path = models_file(work, layout == "invariant")
        server = start_ours(path, args.port, name=f"ours-{layout}", vision=False)
        url = server.base_url
        try:
            time.sleep(args.settle_s)
            asyncio.run(measure(f"ours ({layout})", lambda p, m, url=url: over_http(url, model, p, m), args, nonce))
            if args.stall_tokens:
                emit(
                    {
                        "server": f"ours ({layout})",
                        **asyncio.run(beside_a_long_prompt(url, model, args.stall_tokens, nonce)),
                    }
                )
        finally:
            server.stop()
        if not args.skip_engine:
            one, close = in_process(path)
            try:
                asyncio.run(measure(f"engine alone ({layout})", one, args, nonce))
            finally:
                close()
    if not args.skip_peer:
        layout = llama_server_layout(models_file(work, False))
        peer = start_llama_server(args.llama_server, args.port + 1, **layout)
        try:
            asyncio.run(measure("llama-server", lambda p, m: over_http(peer.base_url, model, p, m), args, nonce))
            if args.stall_tokens:
                stalled = asyncio.run(beside_a_long_prompt(peer.base_url, model, args.stall_tokens, nonce))
                emit({"server": "llama-server", **stalled})
        finally:
            peer.stop()

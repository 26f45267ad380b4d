"""Greedy answers under load, per KV layout of the llama.cpp engine (issue 37): does a greedy
(temperature 0) answer stay the same beside seven sampled requests, and what does each layout cost?

For each layout, in a process of its own (so that its memory is its own), the engine of models.yaml's
first entry is started with the layout's settings, then:

- drift: three greedy prompts (short, about 150 tokens, about 700 tokens: llama.cpp's CPU attention
  picks its kernel by the rows and the KV cells of a step, so the three reach its three paths),
  each answered alone first, then in three rounds beside seven sampled requests (temperature 1,
  prompts of 20 to 500 tokens) started at the same moment: 9 checks, each the same tokens or a drift;
- memory: the process's resident memory once loaded and its peak (`ru_maxrss`);
- speed: greedy output tokens/s at concurrency 1 and 16 (`--speed-tokens` each). Timings on a shared
  machine are noisy; the drift count and the memory are not. `--speed-tokens 0` leaves speed out.

`peer` is the comparison for memory: llama.cpp's own server code with its defaults (xllamacpp's
`Server`, which runs llama-server's code in-process; no llama-server binary is built here), at the
engine's slots and cells, in a process that loads nothing else.

    .venv/bin/python -m scripts.bench greedy                                  # every layout
    .venv/bin/python -m scripts.bench greedy --layouts shared-f16 shared-q8

Prints one JSON line per layout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psutil

from scripts.bench.common import ROOT, arguments, emit

if TYPE_CHECKING:
    from deployments.engines.base import TextEngine

# name -> (engine params over models.yaml's, llama.cpp server settings over the engine's)
LAYOUTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "shared-f16": ({"mem": 512, "kv_cache_dtype": "f16"}, {}),  # the default until issue 37
    "shared-f16-nofa": ({"mem": 512, "kv_cache_dtype": "f16"}, {"flash_attn": False}),
    "shared-f16-ub32": ({"mem": 512, "kv_cache_dtype": "f16", "prefill_chunk_size": 32}, {}),
    "streams-f16": ({"mem": None, "kv_cache_dtype": "f16"}, {}),
    "streams-f16-4slots": ({"mem": None, "kv_cache_dtype": "f16", "max_num_seqs": 4}, {}),
    "shared-q8": ({"mem": 512, "kv_cache_dtype": "q8_0"}, {}),
    "shared-q8-280mb": ({"mem": 280, "kv_cache_dtype": "q8_0"}, {}),
    "streams-q8": ({"mem": None, "kv_cache_dtype": "q8_0"}, {}),
    "streams-q8-8slots": ({"mem": None, "kv_cache_dtype": "q8_0", "max_num_seqs": 8}, {}),
}
PEER = "peer"

WORDS = (
    "river",
    "stone",
    "lantern",
    "orchard",
    "harbor",
    "meadow",
    "copper",
    "violin",
    "garden",
    "winter",
    "signal",
    "compass",
    "ember",
    "thunder",
    "willow",
    "marble",
    "canyon",
    "feather",
    "glacier",
    "almond",
    "saffron",
    "beacon",
    "quartz",
    "timber",
)


def filler(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


GREEDY_PROMPTS = (
    "What is the capital of France?",
    "Summarise these notes in one sentence: " + filler(1, 110),
    "Here is a long list of words. Which word comes up most often? " + filler(2, 520),
)
SAMPLED_PROMPTS = tuple(
    f"Write a short story about these: {filler(10 + i, n)}" for i, n in enumerate((10, 40, 90, 160, 240, 330, 420))
)


def rss_mb() -> int:
    return psutil.Process().memory_info().rss // 2**20


def peak_mb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


async def answer(engine: TextEngine, prompt: str, max_tokens: int, temperature: float) -> tuple[str, int]:
    """One chat turn's text and its completion tokens."""
    from deployments.protocol.replica import GenerateRequest, TextMessage

    request = GenerateRequest(
        messages=[TextMessage(role="user", content=prompt)], max_tokens=max_tokens, temperature=temperature
    )
    text, tokens = [], 0
    async for piece in engine.generate(request):
        text.append(piece.text)
        tokens = piece.completion_tokens
    return "".join(text), tokens


async def drift(
    engine: TextEngine,
    greedy_prompts: Sequence[str],
    sampled_prompts: Sequence[str],
    rounds: int,
    greedy_tokens: int,
    sampled_tokens: tuple[int, int],
) -> list[dict[str, Any]]:
    """Each greedy prompt answered alone, then in `rounds` rounds beside every sampled prompt
    (temperature 1, between `sampled_tokens` new tokens), all started at once, the greedy one at a
    random place among them: the checks whose greedy answer differs from the lone one (the round,
    the prompt, the first character that differs; None: one answer is the other's beginning).
    """
    alone = [(await answer(engine, p, greedy_tokens, 0.0))[0] for p in greedy_prompts]
    drifted: list[dict[str, Any]] = []
    rng = random.Random(0)
    for round_ in range(rounds):
        for i, prompt in enumerate(greedy_prompts):
            sampled = [answer(engine, p, rng.randint(*sampled_tokens), 1.0) for p in sampled_prompts]
            position = rng.randint(0, len(sampled))
            greedy = answer(engine, prompt, greedy_tokens, 0.0)
            results = await asyncio.gather(*sampled[:position], greedy, *sampled[position:])
            text = results[position][0]
            if text != alone[i]:
                at = next((k for k, (a, b) in enumerate(zip(text, alone[i], strict=False)) if a != b), None)
                drifted.append({"round": round_, "prompt": i, "at_char": at, "alone": alone[i], "beside": text})
    return drifted


async def run_layout(name: str, greedy_tokens: int, speed_tokens: int, rounds: int) -> dict[str, Any]:
    """One layout in this process: the engine, then drift, then speed."""
    import deployments.engines.llamacpp.engine as llamacpp_engine
    from deployments.config import load_models_file
    from deployments.engines import create_text_engine

    params, settings = LAYOUTS[name]
    if settings:  # server settings the engine does not expose: over the ones it decides
        server_class = llamacpp_engine.LlamaServer
        llamacpp_engine.LlamaServer = lambda s: server_class(dataclasses.replace(s, **settings))  # type: ignore[misc,assignment]
    model = load_models_file(ROOT / "models.yaml").models[0]
    model = model.model_copy(
        update={"engine": "llama.cpp", "params": model.params.model_copy(update=params)}, deep=True
    )
    engine = create_text_engine(model)
    described = engine.describe()
    loaded_mb = rss_mb()

    drifted = await drift(engine, GREEDY_PROMPTS, SAMPLED_PROMPTS, rounds, greedy_tokens, (32, 96))

    speed: dict[str, float] = {}
    for concurrency in (1, 16) if speed_tokens else ():
        started = time.perf_counter()
        results = await asyncio.gather(
            *(answer(engine, f"Tell me about the number {n}.", speed_tokens, 0.0) for n in range(concurrency))
        )
        speed[f"tok_s_c{concurrency}"] = round(sum(t for _, t in results) / (time.perf_counter() - started), 1)
    engine.close()
    return {
        "layout": name,
        "checks": rounds * len(GREEDY_PROMPTS),
        "drift": len(drifted),
        "drifted": [{k: d[k] for k in ("round", "prompt", "at_char")} for d in drifted],
        "kv_cells": described["kv_cache_tokens"],
        "kv_unified": described["kv_unified"],
        "kv_cache_type": described["kv_cache_type"],
        "kv_cache_mb": described["kv_cache_mb"],
        "slots": described["slots"],
        "rss_loaded_mb": loaded_mb,
        "rss_peak_mb": peak_mb(),
        **speed,
    }


def run_peer(layout: str) -> dict[str, Any]:
    """llama.cpp's server code with its defaults at `layout`'s slots and cells, nothing else loaded."""
    import xllamacpp

    from deployments.config import load_models_file
    from deployments.engines.llamacpp.engine import DEFAULT_CONTEXT, gguf_path
    from deployments.engines.llamacpp.gguf_meta import describe_gguf
    from deployments.engines.llamacpp.kv_cache import kv_layout

    params, _ = LAYOUTS[layout]
    model = load_models_file(ROOT / "models.yaml").models[0]
    engine_params = model.params.model_copy(update=params)
    path = gguf_path(model)
    shape = describe_gguf(path)
    own_len = shape.context_length or DEFAULT_CONTEXT
    cells, unified = kv_layout(
        engine_params, min(engine_params.max_model_len or own_len, own_len), shape.kv_bytes_per_token()
    )
    common = xllamacpp.CommonParams()
    common.model.path = str(path)
    common.n_parallel = engine_params.max_num_seqs
    common.n_ctx = cells
    common.kv_unified = unified
    common.cache_ram_mib = 0  # as the engine (and `llama-server --cache-ram 0`)
    common.cpuparams.n_threads = common.cpuparams_batch.n_threads = os.cpu_count() or 1
    common.verbosity = 1
    server = xllamacpp.Server(common)
    body = {"prompt": "Tell me about the number 7.", "n_predict": 16, "stream": False}
    server.handle_completions(body)
    return {
        "layout": f"{PEER} ({layout}'s slots and cells, llama.cpp's defaults: f16)",
        "kv_cells": cells,
        "kv_unified": unified,
        "rss_loaded_mb": rss_mb(),
        "rss_peak_mb": peak_mb(),
    }


def main(argv: list[str]) -> None:
    parser = arguments("greedy", __doc__)
    parser.add_argument("--layouts", nargs="+", default=[*LAYOUTS, PEER], choices=[*LAYOUTS, PEER])
    parser.add_argument("--peer-of", default="shared-f16", choices=list(LAYOUTS), help="the layout the peer copies")
    parser.add_argument("--greedy-tokens", type=int, default=48)
    parser.add_argument("--speed-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", help=argparse_hidden())
    args = parser.parse_args(argv)
    if args.child == PEER:
        print(json.dumps(run_peer(args.peer_of)), flush=True)
        return
    if args.child:
        record = asyncio.run(run_layout(args.child, args.greedy_tokens, args.speed_tokens, args.rounds))
        print(json.dumps(record), flush=True)
        return
    from deployments.options import REPLICA_ENV

    for layout in args.layouts:
        flags = [*("--peer-of", args.peer_of, "--greedy-tokens", str(args.greedy_tokens))]
        flags += [*("--speed-tokens", str(args.speed_tokens), "--rounds", str(args.rounds))]
        done = subprocess.run(
            [sys.executable, "-m", "scripts.bench", "greedy", "--child", layout, *flags],
            cwd=ROOT,
            env={**os.environ, **REPLICA_ENV["PrimaryDecoder"], "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            check=False,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            emit({"layout": layout, "error": done.stderr[-2000:]})
        else:
            emit(json.loads(lines[-1]))


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS

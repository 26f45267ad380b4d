"""Agent sessions through the service, per decoder layout and router (issue 68): `--sessions` concurrent
sessions of `--turns` turns each, every session with its own long system text (or, `--shared`, a
common one first and then its own), each turn the whole conversation so far plus a new question,
streamed with usage (`cached_tokens`), as Codex, Claude Code or a chat UI resend it.

Layouts (`--layouts`, run one after the other on the offline default, models.yaml's primary alone):
- ``one``: one decoder replica with all the cores;
- ``serve``: two replicas, a core each, Serve's default router (power of two choices);
- ``ray``: two replicas, Ray Serve LLM's `PrefixCacheAffinityRouter` attached (`routing.ray_prefix`);
- ``ours``: two replicas, our router (`routing.router`).

Per layout and case (own prompts; `--shared` adds the shared-prefix case) one JSON line: warm turns'
(turn 2 on) cached share of prompt tokens, warm TTFT p50 / p95 / max, cold TTFT p50, wall time, and
requests per decoder replica (from Ray's metrics export: `routing_requests` for ours, else the
replicas' `request_success`).

    .venv/bin/python -m scripts.bench sessions    # --sessions 6 --turns 5 --system-tokens 1900 --new-tokens 24
    .venv/bin/python -m scripts.bench sessions --sessions 2 --turns 2 --system-tokens 300 --layouts one ours  # smoke
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from httpx import Limits
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from scripts.bench.common import arguments, emit, pct, start_ours
from scripts.bench.overhead import decoder_models
from scripts.bench.serve import machine

LAYOUTS = {"one": (1, "prefix"), "serve": (2, "power_of_two"), "ray": (2, "ray_prefix_cache"), "ours": (2, "prefix")}
WORDS = [
    "river",
    "stone",
    "lantern",
    "harbor",
    "meadow",
    "copper",
    "signal",
    "orchard",
    "canyon",
    "ember",
    "glacier",
    "willow",
]


def system_text(seed: int, tokens: int) -> str:
    """About `tokens` tokens of text of its own (a few words in a seeded order, numbered)."""
    words = [f"{WORDS[(seed * 7 + i * 5) % len(WORDS)]}{(seed * 31 + i) % 97}" for i in range(tokens // 2)]
    return f"Session {seed} notes: " + " ".join(words)


@dataclass
class Turn:
    session: int
    turn: int
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int


async def one_turn(
    client: AsyncOpenAI, model: str, messages: list[dict[str, str]], max_tokens: int, session: int, turn: int
) -> tuple[Turn, str]:
    start, first, text, usage = time.perf_counter(), None, [], None
    stream = await client.chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"x-session-id": f"bench-session-{session}"},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            text.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    end = time.perf_counter()
    prompt = usage.prompt_tokens if usage else 0
    details = getattr(usage, "prompt_tokens_details", None) if usage else None
    cached = (getattr(details, "cached_tokens", 0) or 0) if details else 0
    return Turn(session, turn, (first or end) - start, prompt, cached), "".join(text)


async def session_run(client: AsyncOpenAI, model: str, seed: int, args: Any, shared: str | None) -> list[Turn]:
    own = system_text(seed, args.system_tokens if shared is None else args.system_tokens // 4)
    system = own if shared is None else shared + "\n\n" + own
    messages = [{"role": "system", "content": system}]
    turns = []
    for turn in range(args.turns):
        messages.append({"role": "user", "content": f"Turn {turn}: name three words of the notes, briefly."})
        result, answer = await one_turn(client, model, messages, args.new_tokens, seed, turn)
        messages.append({"role": "assistant", "content": answer})
        turns.append(result)
    return turns


def per_replica(model: str) -> dict[str, float]:
    """Requests per decoder replica so far, from Ray's metrics export (its port in the newest Ray session's
    folder, as `fairness` reads it): ours' `routing_requests` by decoder replica, else the decoder replicas'
    finished requests. Exported every few seconds: read after a pause."""
    from prometheus_client.parser import text_string_to_metric_families

    port = next(Path("/tmp/ray/session_latest").glob("metrics_export_port_*")).read_text().strip()
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    routed: dict[str, float] = {}
    finished: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            if sample.name == "ray_mmserve_routing_requests_total":
                routed[sample.labels.get("decoder_replica", "?")] = sample.value
            elif sample.name == "ray_mmserve_request_success_total":
                replica = sample.labels.get("replica", "?")
                finished[replica] = finished.get(replica, 0.0) + sample.value
    return routed or finished


def counted(model: str) -> dict[str, float]:
    time.sleep(12)  # Ray exports its metrics every few seconds
    try:
        return per_replica(model)
    except (StopIteration, httpx.HTTPError):
        return {}


def summary(turns: list[Turn], wall_s: float) -> dict[str, Any]:
    warm = [t for t in turns if t.turn > 0]
    cold = [t.ttft_s for t in turns if t.turn == 0]
    prompt = sum(t.prompt_tokens for t in warm)
    return {
        "warm_cached_share": round(sum(t.cached_tokens for t in warm) / prompt, 3) if prompt else None,
        "warm_ttft_p50_s": pct([t.ttft_s for t in warm], 0.5) if warm else None,
        "warm_ttft_p95_s": pct([t.ttft_s for t in warm], 0.95) if warm else None,
        "warm_ttft_max_s": round(max(t.ttft_s for t in warm), 3) if warm else None,
        "cold_ttft_p50_s": round(statistics.median(cold), 3) if cold else None,
        "mean_prompt_tokens": round(statistics.mean(t.prompt_tokens for t in turns), 1) if turns else None,
        "wall_s": round(wall_s, 1),
    }


async def workload(base_url: str, model: str, args: Any, shared: bool) -> dict[str, Any]:
    client = AsyncOpenAI(
        base_url=base_url + "/v1",
        api_key="unused",
        max_retries=0,
        timeout=1800,
        http_client=DefaultAsyncHttpxClient(limits=Limits(max_connections=100, max_keepalive_connections=0)),
    )
    common = system_text(999, args.shared_tokens) if shared else None
    start = time.perf_counter()
    runs = await asyncio.gather(*(session_run(client, model, seed, args, common) for seed in range(args.sessions)))
    return summary([t for run in runs for t in run], time.perf_counter() - start)


def models_for(directory: Path, router: str, args: Any) -> Path:
    path = decoder_models(directory, None, None, 0)
    models = yaml.safe_load(path.read_text())
    entry = models["models"][0]
    entry.setdefault("deployment", {})["routing"] = {"router": router}
    if args.cache_ram_mib is not None:
        entry.setdefault("params", {})["cache_ram_mib"] = args.cache_ram_mib
    if args.slots:
        entry.setdefault("params", {})["max_num_seqs"] = args.slots
    out = directory / f"models-{router}.yaml"
    out.write_text(yaml.safe_dump(models))
    return out


def main(argv: list[str]) -> None:
    parser = arguments("sessions", __doc__)
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--system-tokens", type=int, default=1900, help="each session's own system text")
    parser.add_argument("--shared-tokens", type=int, default=1500, help="--shared: the common system text")
    parser.add_argument("--new-tokens", type=int, default=24, help="max_tokens of each turn")
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=list(LAYOUTS))
    parser.add_argument("--shared", action="store_true", help="also the shared-prefix case")
    parser.add_argument("--only-shared", action="store_true", help="the shared-prefix case alone")
    parser.add_argument("--cache-ram-mib", type=int, default=None, help="params.cache_ram_mib (default: models.yaml's)")
    parser.add_argument("--slots", type=int, default=0, help="params.max_num_seqs (0: models.yaml's)")
    parser.add_argument("--port", type=int, default=8123)
    args = parser.parse_args(argv)
    cases = [True] if args.only_shared else [False, True] if args.shared else [False]
    emit({"bench": "sessions", "machine": machine(), "args": vars(args)})
    with tempfile.TemporaryDirectory() as tmp:
        for layout in args.layouts:
            replicas, router = LAYOUTS[layout]
            models_file = models_for(Path(tmp), router, args)
            model = yaml.safe_load(models_file.read_text())["models"][0]["name"]
            server = start_ours(
                models_file, args.port, decoder_replicas=replicas, name=f"sessions-{layout}", vision=False
            )
            try:
                for shared in cases:
                    before = counted(model)
                    result = asyncio.run(workload(server.base_url, model, args, shared))
                    after = counted(model)
                    emit(
                        {
                            "layout": layout,
                            "replicas": replicas,
                            "router": router,
                            "case": "shared_prefix" if shared else "own_prefix",
                            **result,
                            "requests_per_replica": {k: v - before.get(k, 0.0) for k, v in after.items()},
                        }
                    )
            finally:
                server.stop()

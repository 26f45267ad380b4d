"""The client side of `scripts.bench sessions`: agent sessions that resend their whole conversation every
turn, streamed with usage (`cached_tokens`), and what their warm turns show.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from typing import Any

from httpx import Limits
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from scripts.bench.common import image_url, pct

WARM = 0.9  # a turn with this share of its prompt cached is warm
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

    @property
    def cached_share(self) -> float | None:
        return round(self.cached_tokens / self.prompt_tokens, 3) if self.prompt_tokens else None


@dataclass
class Session:
    """One session's conversation so far, resent whole every turn under its `model`."""

    seed: int
    model: str
    messages: list[dict[str, Any]]
    turns: int = 0

    async def turn(self, client: AsyncOpenAI, max_tokens: int) -> Turn:
        self.messages.append({"role": "user", "content": f"Turn {self.turns}: name three words of the notes, briefly."})
        result, answer = await one_turn(client, self.model, self.messages, max_tokens, self.seed, self.turns)
        self.messages.append({"role": "assistant", "content": answer})
        self.turns += 1
        return result


def new_session(seed: int, model: str, args: Any, case: str, common: str | None) -> Session:
    if case == "shared":
        system = f"{common}\n\n{system_text(seed, args.system_tokens // 4)}"
    else:
        system = system_text(seed, args.system_tokens)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    if case == "image":  # the same picture, resent every turn
        picture = [{"type": "image_url", "image_url": {"url": image_url(seed)}}, {"type": "text", "text": "Keep this."}]
        messages += [{"role": "user", "content": picture}, {"role": "assistant", "content": "Kept."}]
    return Session(seed, f"{model}:a{seed % 2}" if case == "adapter" else model, messages)


async def one_turn(
    client: AsyncOpenAI, model: str, messages: list[dict[str, Any]], max_tokens: int, session: int, turn: int
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


def client_for(base_url: str) -> AsyncOpenAI:
    limits = Limits(max_connections=100, max_keepalive_connections=0)
    return AsyncOpenAI(
        base_url=base_url + "/v1",
        api_key="unused",
        max_retries=0,
        timeout=1800,
        http_client=DefaultAsyncHttpxClient(limits=limits),
    )


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


async def workload(base_url: str, model: str, args: Any, case: str) -> dict[str, Any]:
    client = client_for(base_url)
    common = system_text(999, args.shared_tokens) if case == "shared" else None
    sessions = [new_session(seed, model, args, case, common) for seed in range(args.sessions)]

    async def run(session: Session) -> list[Turn]:
        return [await session.turn(client, args.new_tokens) for _ in range(args.turns)]

    start = time.perf_counter()
    runs = await asyncio.gather(*(run(s) for s in sessions))
    return summary([t for run in runs for t in run], time.perf_counter() - start)

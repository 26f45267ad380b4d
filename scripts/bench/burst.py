"""A burst of long prompts at once through a running service (issue 37's case: sixteen prompts of
about 1,200 tokens, `max_tokens` 300): how many are answered, and how the others end (a clean error
with its status and code, or a 500). Start the service first (`./scripts/run.sh`).

    .venv/bin/python -m scripts.bench burst                       # 16 x ~1,200 tokens, max_tokens 300
    .venv/bin/python -m scripts.bench burst --requests 8 --words 600

Prints one JSON line: the count per status and each request's status, tokens, time and error code.
The time to each first token is in the service's access log (`ttft_s`).
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

import httpx

from scripts.bench.common import arguments, emit

WORDS = [
    "the",
    "river",
    "carried",
    "stones",
    "past",
    "old",
    "mills",
    "while",
    "farmers",
    "counted",
    "sheep",
    "and",
    "wrote",
    "long",
    "letters",
    "home",
]


def prompt(i: int, words: int) -> str:
    """A long document, different per request (no prompt shares another's prefix past its first words)."""
    body = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(words))
    return f"Document {i}: {body}\n\nSummarise the document above in detail."


async def one(http: httpx.AsyncClient, url: str, model: str, text: str, max_tokens: int) -> dict[str, Any]:
    started = time.monotonic()
    messages = [{"role": "user", "content": text}]
    reply = await http.post(url, json={"model": model, "messages": messages, "max_tokens": max_tokens})
    json_body = reply.headers.get("content-type", "").startswith("application/json")
    body = reply.json() if json_body else {}  # a 500 may come as plain text
    usage = body.get("usage") or {}
    return {
        "status": reply.status_code,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "seconds": round(time.monotonic() - started, 1),
        "error": (body.get("error") or {}).get("code"),
        "retry_after": reply.headers.get("retry-after"),
    }


async def burst(url: str, model: str, requests: int, words: int, max_tokens: int) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=900) as http:
        started = time.monotonic()
        results = await asyncio.gather(*(one(http, url, model, prompt(i, words), max_tokens) for i in range(requests)))
    statuses = collections.Counter(str(r["status"]) for r in results)
    return {"statuses": dict(statuses), "seconds": round(time.monotonic() - started, 1), "requests": results}


def main(argv: list[str]) -> None:
    parser = arguments("burst", __doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1/chat/completions")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--words", type=int, default=1150, help="words per prompt (1150: about 1,200 tokens)")
    parser.add_argument("--max-tokens", type=int, default=300)
    args = parser.parse_args(argv)
    emit(asyncio.run(burst(args.url, args.model, args.requests, args.words, args.max_tokens)))

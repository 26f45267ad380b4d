"""No answer crosses between requests, through the whole service under concurrent load.

Every request carries a nonce of its own in its text and an image of its own colour (some share
one colour, so the caption cache and in-flight sharing are on the path). The captioner fake
captions by colour and repeats its prompt (which holds the user's text, so the nonce), in
batches; the echo decoder answers with the prompt it received. So each answer must hold its own
nonce and its own colour and nothing of any other request's: the check cannot be fooled by
numerics. Some streams are dropped by their clients mid-way: their nonces must not turn up in
any later answer either. (The real continuous-batching engine's rows are checked in
tests/unit/engines/test_engines.py and, under load, by scripts/loadtest.py's teacher-forced check.)
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid

import httpx
import pytest

from tests.conftest import data_url, png_bytes
from tests.serve.conftest import BASE_URL, deploy, echo_with_captioner, undeploy, write_models

REQUESTS = 48
CONCURRENCY = 16
NONCE = re.compile(r"nonce-[0-9a-f]{8}-\d+")
COLOUR = re.compile(r"rgb\(\d+, \d+, \d+\)")


@pytest.fixture(scope="module")
def service(serve_cluster, tmp_path_factory):
    entries = echo_with_captioner(None, prompt_template="{user_text}", max_batch_size=8, batch_wait_timeout_s=0.05)
    models = write_models(tmp_path_factory.mktemp("isolation"), entries)
    deploy(models, decoder_gpus=0, decoder_cpu_replicas=2)
    yield
    undeploy("default", "vision")


def shared(i: int) -> bool:
    """Every fourth request asks the same thing of one of three shared images (cache hits)."""
    return i % 4 == 0


def colour(i: int) -> tuple[int, int, int]:
    return (7, 7, i % 3) if shared(i) else (i, 255 - i, (i * 37) % 256)


def user_text(i: int, nonce: str) -> str:
    return "What is this?" if shared(i) else f"{nonce} asks: what is this?"


def chat(i: int, nonce: str, stream: bool) -> dict:
    content = [
        {"type": "text", "text": user_text(i, nonce)},
        {"type": "image_url", "image_url": {"url": data_url(png_bytes(colour(i)))}},
    ]
    messages = [{"role": "system", "content": f"You serve {nonce}."}, {"role": "user", "content": content}]
    body = {"model": "echo", "messages": messages, "stream": stream}
    return body | ({"stream_options": {"include_usage": True}} if stream else {})


async def exchange(client: httpx.AsyncClient, body: dict, drop: bool) -> str | None:
    """The answer's text; None for a stream this client drops after its first piece of content."""
    if not body["stream"]:
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]["content"]
    text = ""
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            for choice in event["choices"]:
                text += choice["delta"].get("content") or ""
            if drop and text:
                return None  # leaving the block closes the connection mid-stream
    return text


async def load(run: str) -> tuple[dict[int, str], dict[int, str]]:
    nonces = {i: f"nonce-{run}-{i}" for i in range(REQUESTS)}
    answers: dict[int, str] = {}
    slots = asyncio.Semaphore(CONCURRENCY)

    async def one(client: httpx.AsyncClient, i: int) -> None:
        async with slots:
            text = await exchange(client, chat(i, nonces[i], stream=i % 2 == 1), drop=i % 6 == 1)
            if text is not None:
                answers[i] = text

    async with httpx.AsyncClient(base_url=BASE_URL, timeout=120) as client:
        await asyncio.gather(*(one(client, i) for i in range(REQUESTS)))
    return nonces, answers


def crossings(nonces: dict[int, str], answers: dict[int, str]) -> list[str]:
    """What is wrong with each answer: a missing or foreign nonce or caption colour."""
    problems = []
    for i, text in answers.items():
        found, colours = set(NONCE.findall(text)), set(COLOUR.findall(text))
        if found != {nonces[i]}:
            problems.append(f"request {i}: nonces {sorted(found)} instead of {nonces[i]}")
        if colours != {f"rgb{colour(i)}"}:
            problems.append(f"request {i}: colours {sorted(colours)} instead of rgb{colour(i)}")
        # The caption repeats the prompt it was made for: this request's own text.
        if f"for: {user_text(i, nonces[i])}" not in text:
            problems.append(f"request {i}: no caption made for its own text")
    return problems


def test_no_answer_crosses_between_concurrent_requests(service):
    nonces, answers = asyncio.run(load(uuid.uuid4().hex[:8]))
    dropped = [i for i in nonces if i % 6 == 1]
    assert set(answers) == set(nonces) - set(dropped)
    assert crossings(nonces, answers) == []


def test_the_check_sees_a_crossing():
    """The checker itself: two answers swapped, or one carrying another's caption, are reported."""
    nonces = {1: "nonce-abcdef01-1", 2: "nonce-abcdef01-2"}

    def echoed(i: int, caption_of: int) -> str:
        caption = f"a picture whose corner is rgb{colour(caption_of)} for: {user_text(caption_of, nonces[caption_of])}"
        return f"system: You serve {nonces[i]}.\nuser: {user_text(i, nonces[i])}\nImage 1: {caption}"

    assert crossings(nonces, {1: echoed(1, 1), 2: echoed(2, 2)}) == []
    assert len(crossings(nonces, {1: echoed(2, 2), 2: echoed(1, 1)})) == 6
    assert crossings(nonces, {1: echoed(1, 2), 2: echoed(2, 2)})

"""What keeping a response costs (issue 58): `store: true` against `store: false` on /v1/responses at
concurrency 1, through the real service (`serve run` with serve_config.yaml) over an instant fake
decoder (`engine: fake`, so that the model's own time does not hide the store's) and a local storage
root; the two alternate request by request, and the p50 of each and their difference are reported,
with a continuation's (`previous_response_id`: the stored response read back). Then the store alone
(`deployments.state.responses`), with its caps on: 10,000 responses of a growing agent
conversation written one after the other, sweeping as the ingress does, and what is left on disk
against `responses_max_bytes`. Then a conversation's list (`deployments.state.conversations`, issue
67): a log of `--conversation-items` live items and `--conversation-deletions` deleted ones (added 20
at a time, each deletion a record of its own after them, as the API writes them), and the seconds a
list of its newest 20 takes (the first, and the p50 of 5), a list of its oldest 20 newest first (the
whole log walked) and a read of all its items (a Responses turn's).

    .venv/bin/python -m scripts.bench store          # --rounds 300 --responses 10000 --max-mib 64
    .venv/bin/python -m scripts.bench store --skip-service --skip-responses   # the conversation's list alone

Prints one JSON line per measurement.
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from openai import AsyncOpenAI

from deployments.state.conversations import ConversationStore, items_path
from deployments.state.owners import Caller
from deployments.state.records import stored_owners
from deployments.state.responses import StoredResponses
from deployments.state.storage import LocalStorage
from scripts.bench.common import arguments, emit, start_ours
from scripts.bench.serve import machine

MODEL = "instant"


def models_file(directory: Path, root: Path, max_tokens: int = 16) -> Path:
    """A models.yaml of one instant fake decoder (`MODEL`), its storage root at `root`."""
    entry = {"name": MODEL, "engine": "fake", "params": {"max_tokens": max_tokens}, "fake": {"token_delay_ms": 0}}
    path = directory / "models.yaml"
    path.write_text(yaml.safe_dump({"models": [entry], "server": {"state": {"storage_root": str(root)}}}))
    return path


async def latencies(base_url: str, rounds: int) -> dict[str, list[float]]:
    """Seconds per whole (not streamed) response: kept, not kept, and continuing a kept one, in turn."""
    client = AsyncOpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0)
    times: dict[str, list[float]] = {"store": [], "no_store": [], "continued": []}
    previous = None
    for i in range(rounds + 20):
        for kind in ("store", "no_store", "continued"):
            started = time.perf_counter()
            extra: dict[str, Any] = {"previous_response_id": previous} if kind == "continued" else {}
            response = await client.responses.create(
                model=MODEL, input=f"Say something about {i}.", store=kind != "no_store", **extra
            )
            if i >= 20:  # the first are warm-up
                times[kind].append(time.perf_counter() - started)
            if kind == "store":
                previous = response.id
    await client.close()
    return times


def turn(i: int, history: int) -> dict[str, Any]:
    """A stored entry as an agent's turn leaves it: the turn's input and output, and the conversation
    before it (its last `history` turns, a few hundred bytes each).
    """
    message = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": f"step {i}: " + "x" * 300}],
    }
    output = {"id": f"msg_{i}", "type": "message", "role": "assistant", "status": "completed"}
    output["content"] = [{"type": "output_text", "text": "done " * 40, "annotations": []}]
    response = {"id": f"resp_{i:08d}", "object": "response", "status": "completed", "output": [output]}
    return {"response": response, "input": [message], "conversation": [message, output] * history}


def store_alone(responses: int, max_bytes: int) -> dict[str, Any]:
    """`responses` entries put one after the other (chains of 20 turns), swept as `put` sweeps;
    the put's p50, then what the shelf and the disk hold.
    """
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # not a line per sweep
    with tempfile.TemporaryDirectory(prefix="bench-store-") as root:
        storage = LocalStorage(root)
        store = StoredResponses(storage, stored_owners(storage), max_bytes, 30 * 24 * 3600)

        async def put_all() -> list[float]:
            took = []
            for i in range(responses):
                entry = turn(i, i % 20)
                started = time.perf_counter()
                await store.put(entry["response"]["id"], entry, Caller())
                took.append(time.perf_counter() - started)
            if store._sweeping is not None:
                await store._sweeping
            return took

        took = asyncio.run(put_all())
        before = store.size()
        store.sweep()  # what a replica's next sweep leaves
        kept, kept_bytes = store.size()
        on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
        return {
            "responses_written": responses,
            "put_p50_ms": round(1000 * statistics.median(took), 3),
            "max_bytes": max_bytes,
            "kept_before_last_sweep": before[0],
            "bytes_before_last_sweep": before[1],
            "kept": kept,
            "kept_bytes": kept_bytes,
            "files_bytes_on_disk": on_disk,
            "oldest_kept": min((n for n in os.listdir(Path(root) / "responses")), default=None),
        }


def conversation_list(live: int, deletions: int, lists: int = 5) -> dict[str, Any]:
    """One conversation's log of `live + deletions` items, 20 to a record, then a deletion record for
    each of `deletions` of them (spread over the log); the seconds each list of its newest 20 takes.
    """
    with tempfile.TemporaryDirectory(prefix="bench-store-") as root:
        storage = LocalStorage(root)
        store = ConversationStore(storage, stored_owners(storage), max_bytes=1 << 40)
        caller = Caller()
        conversation = store.create([], None, caller)["id"]
        total = live + deletions
        every = total / deletions if deletions else 0.0
        deleted = {f"msg_{int(n * every):08d}" for n in range(deletions)}
        for start in range(0, total, 20):  # written as the store writes them, without a replay per add
            items = [
                {"id": f"msg_{i:08d}", "type": "message", "role": "user", "status": "completed"}
                | {"content": [{"type": "input_text", "text": f"step {i}: " + "x" * 100}]}
                for i in range(start, min(start + 20, total))
            ]
            store._append(conversation, None, {"add": items}, force=True)
        for item_id in sorted(deleted):
            store._append(conversation, None, {"delete": item_id}, force=True)
        took = []
        for _ in range(lists):
            started = time.perf_counter()
            listed = store.list_items(conversation, caller, 20, None)
            took.append(time.perf_counter() - started)
        started = time.perf_counter()
        everything = store.items(conversation, caller)  # what a Responses turn reads: the whole log
        whole = time.perf_counter() - started
        assert len(listed["data"]) == min(20, live) and len(everything) == live
        started = time.perf_counter()  # the oldest page, newest first: the whole log walked
        oldest = store.list_items(conversation, caller, 20, everything[min(20, live - 1)]["id"] if live else None)
        last_page = time.perf_counter() - started
        assert len(oldest["data"]) == min(20, live)
        return {
            "conversation_items": live,
            "conversation_deletions": deletions,
            "log_bytes": storage.size(items_path(conversation)),
            "list_first_s": round(took[0], 4),
            "list_p50_s": round(statistics.median(took), 4),
            "list_oldest_page_s": round(last_page, 4),
            "all_items_s": round(whole, 4),
        }


def main(argv: list[str]) -> None:
    parser = arguments("store", __doc__)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--responses", type=int, default=10_000)
    parser.add_argument("--max-mib", type=float, default=64.0, help="responses_max_bytes of the store-alone run")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--skip-service", action="store_true")
    parser.add_argument("--skip-responses", action="store_true", help="no store-alone run of stored responses")
    parser.add_argument("--conversation-items", type=int, default=20_000, help="live items of the listed conversation")
    parser.add_argument("--conversation-deletions", type=int, default=20_000, help="deleted items in its log")
    args = parser.parse_args(argv)
    emit({"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S")})
    if not args.skip_service:
        with tempfile.TemporaryDirectory(prefix="bench-store-") as work:
            os.chmod(work, 0o700)
            models = models_file(Path(work), Path(work) / "storage")
            server = start_ours(models, args.port, name="store", vision=False)
            try:
                times = asyncio.run(latencies(server.base_url, args.rounds))
            finally:
                server.stop()
        p50 = {kind: statistics.median(values) for kind, values in times.items()}
        emit(
            {
                "concurrency": 1,
                "rounds": args.rounds,
                **{f"{kind}_p50_ms": round(1000 * value, 2) for kind, value in p50.items()},
                "store_adds_p50_ms": round(1000 * (p50["store"] - p50["no_store"]), 2),
                "continuation_adds_p50_ms": round(1000 * (p50["continued"] - p50["store"]), 2),
            }
        )
    if not args.skip_responses:
        emit(store_alone(args.responses, int(args.max_mib * 1024 * 1024)))
    emit(conversation_list(args.conversation_items, args.conversation_deletions))

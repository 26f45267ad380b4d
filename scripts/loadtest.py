"""Load and soak test: concurrent mixed chat requests against a running mmserve, with faults.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/loadtest.py --serve --requests 500 --concurrency 16 \\
        --kill captioner@60 --kill decoder@150
    HF_HUB_OFFLINE=1 .venv/bin/python scripts/loadtest.py --serve --duration-s 1860 --concurrency 16 \\
        --kill captioner@600 --kill decoder@1200 --out soak.json          # the 30-minute soak

Requests mix text and images, streaming and not, greedy, each with its own `x-request-id`; a share of
the streams is dropped by the client after its first piece (`--disconnect-share`). Images are either
calibrated (a fixed set; captioned once, then served from the caption cache) or fresh noise that the
captioner must caption. Before the load, each calibrated prompt is sent once, alone: its
`usage.prompt_tokens` and answer are the reference.

Isolation: every answer must carry its own request id. A calibrated answer is `ok` (its reference),
`drift` (another answer that its own prompt explains token by token, teacher-forced on the same
weights in float32: batched greedy numerics), `crossed` (another prompt's token count, or tokens its
own prompt does not explain and another prompt does) or `unexplained` (no prompt explains it); see
scripts/answer_check.py. Drift is reported on its own, as a rate against concurrency: a sweep before
the load sends the text prompts at `--sweep` concurrencies, and the load's answers are bucketed by
the requests in flight when each was sent.

Failures are classed by HTTP status and OpenAI error code (a 429/503 without Retry-After is
marked), stream error event, protocol violation or client exception. A failure that ends within
--fault-window-s after an injected fault that can explain it (decoder: any request; captioner: image
requests) is *explained*. After the load, the decoder must show no running or waiting sequence
(dropped streams freed their slots). Every `--sample-s` the resident memory and open file
descriptors of every Serve process, the caption cache and the object store are sampled; a replica
whose memory grows more than `--max-growth` from 5 minutes into its life to the end fails the run.
Prints one JSON report; exits 1 unless its verdict is `pass`.

--serve starts the service as scripts/bench.py does (tiny local captioner, offline SmolLM2) on the
port of --url, and stops it at the end. --kill TARGET@SECONDS (decoder or captioner) kills that
deployment's replicas through Ray (`ray.kill(no_restart=True)`); Serve starts replacements.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import itertools
import json
import logging
import os
import random
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import psutil
from PIL import Image

# Clusters started by `serve run` use token auth; Ray reads this when it is first imported.
os.environ.setdefault("RAY_AUTH_MODE", "token")

from deployments.testing.answer_check import DEFAULT_TOL, AnswerScorer, Reference, classify
from deployments.testing.bench import Server, image_url, pct, start_ours, write_models
from deployments.testing.resource_watch import ResourceWatch

ROOT = Path(__file__).resolve().parents[1]

WORDS = "apple river stone cloud tiger lamp violin garden rocket pepper island mirror".split()  # noqa: SIM905


def user(text: str, image: str | None = None) -> list[dict[str, Any]]:
    parts = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": image}}]
    return [{"role": "user", "content": parts if image else text}]


# Calibrated prompts: twelve unlike questions (so one's answer is no answer to another's, and the
# teacher-forced check tells them apart) and six images with hints of different lengths.
QUESTIONS = [
    "What is the capital of Japan?",
    "Name a fruit that is red.",
    "Write a haiku about the sea.",
    "Count from one to five.",
    "How many legs does a spider have?",
    "Give a synonym for happy.",
    "Who wrote Romeo and Juliet?",
    "Describe a rainy day in one sentence.",
    "Translate 'good morning' into French.",
    "List three kinds of trees.",
    "Why do birds migrate in winter?",
    "Explain what a volcano is to a child.",
]
CALIBRATED = {f"text{k}": user(question) for k, question in enumerate(QUESTIONS)}
CALIBRATED |= {
    f"image{k}": user(f"Describe the picture. Hint: {' '.join(WORDS[: k + 1])}.", image_url(k)) for k in range(6)
}
TARGETS = {"decoder": ("default", "PrimaryDecoder"), "captioner": ("vision", "VisionCaptioner")}


@dataclass
class Spec:
    key: str | None  # calibration key; None: a fresh image, not content-checked
    image: bool
    stream: bool
    messages: list[dict[str, Any]]
    drop: bool = False  # the client closes the stream after its first piece of content

    @property
    def kind(self) -> str:
        return ("image" if self.image else "text") + ("/stream" if self.stream else "")


@dataclass
class Outcome:
    spec: Spec
    rid: str
    start: float
    end: float = 0.0
    ttft: float | None = None
    error: str | None = None
    text: str = ""
    prompt_tokens: int | None = None
    id_ok: bool = True
    degraded: bool = False
    dropped: bool = False  # by this client, on purpose (Spec.drop)
    inflight: int = 0  # requests of this run in flight when it was sent, itself included


@dataclass
class Fault:
    target: str
    at_s: float
    killed: list[str] = field(default_factory=list)
    error: str | None = None


def fresh_image(seed: int) -> str:
    img = Image.frombytes("RGB", (64, 64), random.Random(seed).randbytes(64 * 64 * 3))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def make_spec(i: int, args: argparse.Namespace) -> Spec:
    rng = random.Random(f"{args.seed}-{i}")
    image, stream = rng.random() < args.image_share, rng.random() < args.stream_share
    drop = stream and rng.random() < args.disconnect_share
    if image and rng.random() < args.fresh_share:
        return Spec(None, True, stream, user("What is in this image?", fresh_image(rng.getrandbits(64))), drop)
    key = rng.choice([k for k in CALIBRATED if k.startswith("image" if image else "text")])
    return Spec(key, image, stream, CALIBRATED[key], drop)


# ----------------------------------------------------------------------------- one request


def http_class(response: httpx.Response) -> str:
    try:
        err = response.json().get("error") or {}
    except (ValueError, AttributeError):
        err = {}
    code, status = err.get("code") or err.get("type") or "-", response.status_code
    missing = status in (429, 503) and "retry-after" not in response.headers
    return f"http_{status}:{code}" + (":no-retry-after" if missing else "")


async def exchange(client: httpx.AsyncClient, body: dict[str, Any], out: Outcome) -> None:
    cid = f"chatcmpl-{out.rid}"
    async with client.stream("POST", "/v1/chat/completions", json=body, headers={"x-request-id": out.rid}) as r:
        out.degraded = "x-vision-degraded" in r.headers
        if r.status_code != 200:
            await r.aread()
            out.error = http_class(r)
            return
        out.id_ok = r.headers.get("x-request-id") == out.rid
        if not body["stream"]:
            data = json.loads(await r.aread())
            out.text, out.prompt_tokens = data["choices"][0]["message"]["content"], data["usage"]["prompt_tokens"]
            out.id_ok &= data["id"] == cid
            return
        finishes, done = 0, False
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if done:
                out.error = "protocol:data-after-done"
                return
            if line == "data: [DONE]":
                done = True
                continue
            event = json.loads(line[6:])
            if "error" in event:  # after the first byte, errors come as one event, then [DONE]
                out.error = out.error or f"stream:{event['error'].get('type')}:{event['error'].get('code')}"
                continue
            out.id_ok &= event["id"] == cid
            for choice in event["choices"]:
                if content := choice["delta"].get("content"):
                    out.ttft = out.ttft if out.ttft is not None else time.monotonic() - out.start
                    out.text += content
                finishes += choice.get("finish_reason") is not None
            if out.spec.drop and out.text:
                out.dropped = True  # leaving the block closes the connection mid-stream
                return
            if event.get("usage"):
                out.prompt_tokens = event["usage"]["prompt_tokens"]
    if out.error is None and not done:
        out.error = "protocol:no-done"
    elif out.error is None and finishes != 1:
        out.error = f"protocol:{finishes}-finish-reasons"
    elif out.error is None and out.prompt_tokens is None:
        out.error = "protocol:no-usage"


async def send(client: httpx.AsyncClient, model: str, spec: Spec, rid: str, args: argparse.Namespace) -> Outcome:
    body = {"model": model, "messages": spec.messages, "max_tokens": args.max_tokens, "temperature": 0}
    body |= {"stream": True, "stream_options": {"include_usage": True}} if spec.stream else {"stream": False}
    out = Outcome(spec, rid, time.monotonic())
    try:
        await asyncio.wait_for(exchange(client, body, out), args.timeout_s)
    except TimeoutError:
        out.error = "timeout:client"
    except httpx.TimeoutException as exc:
        out.error = f"timeout:{type(exc).__name__}"
    except httpx.TransportError as exc:
        out.error = f"connection:{type(exc).__name__}"
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        out.error = f"protocol:{type(exc).__name__}"
    out.end = time.monotonic()
    return out


def verdicts(
    outcomes: list[Outcome], refs: dict[str, Reference], scorer: AnswerScorer | None, tol: float
) -> dict[int, tuple[str, float | None]]:
    """`classify` for each successful, complete, undegraded calibrated answer; `unchecked` otherwise."""
    return {
        id(o): (
            ("unchecked", None)
            if o.error or o.dropped or o.spec.key is None or o.degraded
            else classify(o.spec.key, o.text, o.prompt_tokens, refs, scorer, tol)
        )
        for o in outcomes
    }


# ----------------------------------------------------------------------------- faults and health


def connect_ray(port: int, address: str | None) -> str:
    """Join the Ray cluster whose Serve listens on `port` (other clusters on this machine are left alone)."""
    import ray
    from ray._private.services import find_gcs_addresses

    for candidate in [address] if address else sorted(find_gcs_addresses()) or ["auto"]:
        ray.init(address=candidate, namespace="serve", log_to_driver=False, logging_level=logging.ERROR)
        try:
            controller = ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
            if ray.get(controller.get_http_config.remote(), timeout=30).port == port:  # type: ignore[attr-defined]
                return candidate
        except Exception:  # no Serve there
            pass
        ray.shutdown()
    raise SystemExit(f"no Ray cluster here runs Serve on port {port}; pass --ray-address")


def gcs_address(pid: int) -> str | None:
    """The GCS address of the Ray cluster a process started (its raylet and workers carry it)."""
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            flags = [a.split("=", 1)[1] for a in child.cmdline() if a.startswith("--gcs-address=")]
            if flags:
                return flags[0]
    return None


def kill_replicas(app: str, deployment: str) -> list[str]:
    import ray

    prefix = f"SERVE_REPLICA::{app}#{deployment}#"
    actors = [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)]
    for actor in actors:
        ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
    return [a["name"] for a in actors]


async def inject(faults: list[Fault], t0: float, finished: asyncio.Event) -> None:
    for fault in faults:
        try:
            await asyncio.wait_for(finished.wait(), max(0.0, t0 + fault.at_s - time.monotonic()))
            fault.error = "not injected: the load had ended"
        except TimeoutError:
            try:
                fault.killed = await asyncio.to_thread(kill_replicas, *TARGETS[fault.target])
            except Exception as exc:
                fault.error = f"{type(exc).__name__}: {exc}"[:300]


async def health(client: httpx.AsyncClient) -> dict[str, Any]:
    try:
        return (await client.get("/health", timeout=15)).json()
    except (httpx.HTTPError, ValueError) as exc:
        return {"status": f"unreachable: {type(exc).__name__}"}


async def watch_health(client: httpx.AsyncClient, t0: float, finished: asyncio.Event, timeline: list[tuple]) -> None:
    """/health once a second; records each change of its status (and which components are not ready)."""
    last = None
    while not finished.is_set():
        data = await health(client)
        down = sorted(k for k, c in data.get("components", {}).items() if not c.get("ready"))
        state = data.get("status", "?") + (f" ({','.join(down)} not ready)" if down else "")
        if state != last:
            timeline.append((round(time.monotonic() - t0, 1), state))
            last = state
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(finished.wait(), 1.0)


async def watch_resources(
    client: httpx.AsyncClient, watch: ResourceWatch, every_s: float, finished: asyncio.Event
) -> None:
    while True:
        await asyncio.to_thread(watch.sample, await health(client))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(finished.wait(), every_s)
            return


async def slots_free_after_s(client: httpx.AsyncClient, within_s: float = 30.0) -> float | None:
    """Seconds after the load until /health showed no running or waiting sequence five times in a row
    (each answer comes from one decoder replica); None if it never did within `within_s`."""
    start, streak = time.monotonic(), 0
    while (elapsed := time.monotonic() - start) < within_s:
        details = (await health(client)).get("components", {}).get("decoder", {}).get("details", {})
        busy = details.get("running", 0) + details.get("waiting", 0)
        streak = streak + 1 if busy == 0 and "busy" not in details else 0
        if streak == 5:
            return round(elapsed, 1)
        await asyncio.sleep(0.2)
    return None


# ----------------------------------------------------------------------------- run and report


def stats(values: list[float]) -> dict[str, Any]:
    qs = {"p50": 0.5, "p95": 0.95, "p99": 0.99}
    return {"n": len(values), **({k: pct(values, q) for k, q in qs.items()} if values else {})}


def recovery_s(timeline: list[tuple[float, str]], at: float) -> float | None:
    """Seconds from a fault until /health said "ok" again, after having said something else."""
    after = [(t, s) for t, s in timeline if t >= at]
    down = next((i for i, (_, s) in enumerate(after) if s != "ok"), None)
    return None if down is None else next((round(t - at, 1) for t, s in after[down:] if s == "ok"), None)


def drift_rates(checked: list[tuple[int, str]]) -> dict[str, Any]:
    """Drifted share of the checked answers per level (concurrency, or requests in flight)."""
    levels = sorted({level for level, _ in checked})
    rates = {}
    for level in levels:
        verdicts_at = [v for lv, v in checked if lv == level]
        rates[str(level)] = {
            "checked": len(verdicts_at),
            "drift": round(verdicts_at.count("drift") / len(verdicts_at), 3),
        }
    return rates


def isolation(outcomes: list[Outcome], judged: dict[int, tuple[str, float | None]], refs: dict) -> dict[str, Any]:
    counts = Counter(v for v, _ in judged.values())
    gaps = [g for v, g in judged.values() if v == "drift" and g is not None]

    def example(o: Outcome) -> dict[str, Any]:
        verdict, gap = judged[id(o)]
        ref = refs[o.spec.key]
        return {
            "rid": o.rid,
            "verdict": verdict,
            "own_prompt_gap": gap,
            "prompt_tokens": [o.prompt_tokens, ref.prompt_tokens],
            "text": [o.text, ref.answer],
        }

    bad = [o for o in outcomes if judged[id(o)][0] in ("crossed", "unexplained")]
    drifted = [o for o in outcomes if judged[id(o)][0] == "drift"]
    buckets = [
        (min(o.inflight, 16) // 4 * 4, judged[id(o)][0]) for o in outcomes if judged[id(o)][0] in ("ok", "drift")
    ]
    return {
        **{k: counts[k] for k in ("ok", "drift", "crossed", "unexplained", "unchecked")},
        "id_mismatches": sum(not o.id_ok for o in outcomes if not o.error),
        "degraded_image_answers": sum(o.degraded for o in outcomes if not o.error),
        "drift_max_own_prompt_gap": max(gaps, default=None),
        "drift_by_inflight": drift_rates(buckets),
        "examples": [example(o) for o in [*bad, *drifted][:3]],
    }


def report(
    outcomes: list[Outcome], judged: dict, refs: dict, faults: list[Fault], timeline: list, args: argparse.Namespace
) -> dict:
    ok, failed = [o for o in outcomes if not o.error], [o for o in outcomes if o.error]

    def explains(f: Fault, o: Outcome) -> bool:
        in_window = 0 <= o.end - f.at_s <= args.fault_window_s
        return bool(f.killed) and in_window and (f.target != "captioner" or o.spec.image)

    unexplained = [o for o in failed if not any(explains(f, o) for f in faults)]
    kinds = sorted({o.spec.kind for o in ok})
    return {
        "faults_survived": all(f.killed for f in faults) and not unexplained if faults else None,
        "requests_sent": len(outcomes),
        "succeeded": len(ok),
        "dropped_by_client": sum(o.dropped for o in ok),
        "failed": len(failed),
        "success_rate": round(len(ok) / max(1, len(outcomes)), 4),
        "failed_by_class": dict(Counter(o.error for o in failed).most_common()),
        "unexplained_failures": len(unexplained),
        "unexplained_by_class": dict(Counter(o.error for o in unexplained).most_common()),
        "sent_by_kind": dict(Counter(o.spec.kind for o in outcomes)),
        "checks": isolation(outcomes, judged, refs),
        "latency_s": {
            "all": stats([o.end - o.start for o in ok if not o.dropped]),
            **{k: stats([o.end - o.start for o in ok if o.spec.kind == k and not o.dropped]) for k in kinds},
        },
        "ttft_s": stats([o.ttft for o in ok if o.ttft is not None]),
        "faults": [
            {
                "target": f.target,
                "at_s": f.at_s,
                "killed": f.killed,
                **({"error": f.error} if f.error else {}),
                "failures_in_window": dict(Counter(o.error for o in failed if explains(f, o))),
                "last_failure_after_s": max((round(o.end - f.at_s, 1) for o in failed if explains(f, o)), default=None),
                "health_ok_again_after_s": recovery_s(timeline, f.at_s),
            }
            for f in faults
        ],
    }


async def calibrate(client: httpx.AsyncClient, model: str, run_id: str, args: argparse.Namespace) -> dict:
    """Each calibrated prompt alone, one after the other: the reference answers."""
    refs: dict[str, Reference] = {}
    for key, messages in CALIBRATED.items():
        image = key.startswith("image")
        out = await send(client, model, Spec(key, image, False, messages), f"lt-{run_id}-{key}", args)
        if out.error or out.degraded:
            raise SystemExit(f"calibration of {key} failed: {out.error or 'captioner degraded'}")
        refs[key] = Reference(None if image else messages, out.text, out.prompt_tokens)
    return refs


async def sweep(
    client: httpx.AsyncClient, model: str, run_id: str, levels: list[int], args: argparse.Namespace
) -> list[tuple[int, Outcome]]:
    """Before the load: at each concurrency, rounds of that many text prompts at once (12 or more)."""
    texts = [k for k in CALIBRATED if k.startswith("text")]
    results: list[tuple[int, Outcome]] = []
    for level in levels:
        for r in range(-(-len(texts) // level)):
            keys = [texts[(r * level + i) % len(texts)] for i in range(level)]
            outs = await asyncio.gather(
                *(
                    send(client, model, Spec(key, False, False, CALIBRATED[key]), f"lt-{run_id}-c{level}-{r}-{i}", args)
                    for i, key in enumerate(keys)
                )
            )
            results += [(level, o) for o in outs]
    return results


async def run(args: argparse.Namespace, watch: ResourceWatch | None, scorer: AnswerScorer | None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=args.concurrency + 4)
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=args.timeout_s, limits=limits) as client:
        model = args.model or (await client.get("/v1/models")).raise_for_status().json()["data"][0]["id"]
        run_id, start = uuid.uuid4().hex[:8], time.monotonic()
        refs = await calibrate(client, model, run_id, args)
        calibration = {
            "prompts": len(refs),
            "seconds": round(time.monotonic() - start, 1),
            "distinct_prompt_tokens": len({r.prompt_tokens for r in refs.values()}),
            "distinct_answers": len({r.answer for r in refs.values()}),
        }
        swept = await sweep(client, model, run_id, args.sweep, args) if args.sweep else []
        faults = sorted((Fault(t, float(s)) for t, s in (k.split("@") for k in args.kill)), key=lambda f: f.at_s)
        finished, counter = asyncio.Event(), itertools.count()
        timeline: list[tuple[float, str]] = []
        outcomes: list[Outcome] = []
        inflight = 0
        t0 = time.monotonic()

        async def worker() -> None:
            nonlocal inflight
            while (i := next(counter)) < (args.requests or sys.maxsize):
                if args.duration_s and time.monotonic() - t0 >= args.duration_s:
                    return
                inflight += 1
                sent_with = inflight
                out = await send(client, model, make_spec(i, args), f"lt-{run_id}-{i}", args)
                inflight -= 1
                out.inflight = sent_with
                outcomes.append(out)

        background = [asyncio.create_task(watch_health(client, t0, finished, timeline))]
        background += [asyncio.create_task(inject(faults, t0, finished))] if faults else []
        if watch is not None:
            watch.t0 = t0
            background.append(asyncio.create_task(watch_resources(client, watch, args.sample_s, finished)))
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        wall = time.monotonic() - t0
        finished.set()
        await asyncio.gather(*background)
        slots_free = await slots_free_after_s(client)
        if watch is not None:
            watch.sample(await health(client))  # the last sample, at the end of the load
    for o in outcomes:  # times from the start of the load
        o.start, o.end = o.start - t0, o.end - t0
    judged = verdicts([o for _, o in swept] + outcomes, refs, scorer, args.gap_tol)
    swept_checked = [(level, judged[id(o)][0]) for level, o in swept if judged[id(o)][0] != "unchecked"]
    result = {
        "url": args.url,
        "model": model,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "calibration": calibration,
        "isolation_check": {
            "teacher_forced": scorer is not None,
            "gap_tol": args.gap_tol,
            **(scorer.discrimination(refs, args.gap_tol) if scorer else {}),
        },
        "drift_by_concurrency": {
            **drift_rates(swept_checked),
            "bad": sum(v in ("crossed", "unexplained") for _, v in swept_checked),
        },
        "load_seconds": round(wall, 1),
        "requests_per_s": round(len(outcomes) / wall, 2),
        **report(outcomes, judged, refs, faults, timeline, args),
        "decoder_slots_free_after_s": slots_free,
        "health_timeline": timeline,
    }
    if watch is not None:
        result["resources"] = {
            "growth": watch.growth(args.max_growth),
            "table": watch.table(),
            "samples": watch.samples,
        }
    checks = result["checks"]
    bad = (
        checks["crossed"] + checks["unexplained"] + checks["id_mismatches"] + result["unexplained_failures"]
        or result["drift_by_concurrency"]["bad"]
        or slots_free is None
        or any(g.get("ok") is False for g in result.get("resources", {}).get("growth", {}).values())
    )
    return {"verdict": "fail" if bad else "pass", **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", help="default: the first id from /v1/models")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, help="total requests (default 500 without --duration-s)")
    parser.add_argument("--duration-s", type=float, help="stop issuing requests after this long")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--image-share", type=float, default=0.3, help="fraction of requests with an image")
    parser.add_argument("--fresh-share", type=float, default=0.5, help="of image requests: fresh (uncached) images")
    parser.add_argument("--stream-share", type=float, default=0.5)
    parser.add_argument("--disconnect-share", type=float, default=0.1, help="of streams: dropped after 1st piece")
    parser.add_argument("--timeout-s", type=float, default=300, help="per request, end to end")
    parser.add_argument("--api-key", default=os.environ.get("MMSERVE_API_KEY"), help="default: $MMSERVE_API_KEY")
    parser.add_argument("--seed", type=int, default=0, help="the request mix")
    parser.add_argument("--kill", action="append", default=[], metavar="TARGET@S", help=f"one of {sorted(TARGETS)}")
    parser.add_argument("--fault-window-s", type=float, default=90, help="failures this long after a fault: explained")
    parser.add_argument("--ray-address", help="for --kill (default: the local cluster whose Serve has --url's port)")
    parser.add_argument("--serve", action="store_true", help="start the service (as bench.py does) and stop it after")
    parser.add_argument("--quantization", help="with --serve: the decoder's quantization (default: models.yaml's)")
    parser.add_argument(
        "--models-file", type=Path, default=ROOT / "models.yaml", help="the served models.yaml, for the answer check"
    )
    parser.add_argument("--no-teacher-forcing", action="store_true", help="skip the answer check's model")
    parser.add_argument("--gap-tol", type=float, default=DEFAULT_TOL, help="logits; see scripts/answer_check.py")
    parser.add_argument("--sweep", type=lambda v: [int(x) for x in v.split(",") if x], default=[1, 2, 4, 8, 16])
    parser.add_argument("--sample-s", type=float, default=60, help="resource samples this often")
    parser.add_argument("--max-growth", type=float, default=0.05, help="replica RSS growth allowed after 5 minutes")
    parser.add_argument("--out", type=Path, help="also write the JSON report here")
    args = parser.parse_args()
    if not args.requests and not args.duration_s:
        args.requests = 500
    for kill in args.kill:
        if kill.partition("@")[0] not in TARGETS or not kill.partition("@")[2].replace(".", "", 1).isdigit():
            parser.error(f"--kill {kill}: expected TARGET@SECONDS with TARGET one of {sorted(TARGETS)}")

    port = urlparse(args.url).port or 80
    server: Server | None = None
    if args.serve:
        from deployments.testing.tiny_models import SMALL_VLM, build_tiny_vlm

        work = ROOT / "models" / "loadtest"
        work.mkdir(parents=True, exist_ok=True)
        captioner = work / "small-vlm"
        if not (captioner / "config.json").exists():
            build_tiny_vlm(captioner, SMALL_VLM)
        args.models_file = write_models(work, captioner, max_batch_size=8)
        print(f"starting the service on port {port} (log: /tmp/bench-loadtest.log)", file=sys.stderr, flush=True)
        server = start_ours(args.models_file, port, quantization=args.quantization, name="loadtest")
    scorer = None if args.no_teacher_forcing else AnswerScorer(args.models_file)
    try:
        address = args.ray_address
        if server is not None and address is None:  # our own cluster: the one under `serve run`
            address = gcs_address(server.proc.pid)
        address = connect_ray(port, address)
        watch = ResourceWatch(server.proc.pid if server else None, address)
        result = asyncio.run(run(args, watch, scorer))
    finally:
        import ray

        ray.shutdown()  # leave the cluster before it goes away: a driver that loses it exits at once
        if server is not None:
            server.stop()
    text = json.dumps(result, indent=1)
    print(text, flush=True)
    if args.out:
        args.out.write_text(text + "\n")
    sys.exit(0 if result["verdict"] == "pass" else 1)


if __name__ == "__main__":
    main()

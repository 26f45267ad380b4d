r"""Load and soak test: concurrent mixed chat requests against a running mmserve, with faults.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/loadtest.py --serve --requests 500 --concurrency 16 \
        --kill captioner@60 --kill decoder@150
    HF_HUB_OFFLINE=1 .venv/bin/python scripts/loadtest.py --serve --duration-s 1860 --concurrency 16 \
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
scripts/load/answer_check.py. Drift is reported on its own, as a rate against concurrency: a sweep before
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

--serve starts the service as `python -m scripts.bench serve` does (tiny local captioner, offline SmolLM2) on the
port of --url, and stops it at the end. --kill TARGET@SECONDS (decoder or captioner) kills that
deployment's replicas through Ray (`ray.kill(no_restart=True)`); Serve starts replacements.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import itertools
import json
import os
import random
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
from PIL import Image

# Clusters started by `serve run` use token auth; Ray reads this when it is first imported.
os.environ.setdefault("RAY_AUTH_MODE", "token")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: scripts.load, scripts.bench

from scripts.bench.common import Server, image_url, start_ours, write_models
from scripts.load.answer_check import DEFAULT_TOL, AnswerScorer, Reference
from scripts.load.faults import TARGETS, Fault, connect_ray, gcs_address, inject
from scripts.load.report import Outcome, Spec, drift_rates, report, verdicts
from scripts.load.watch import ResourceWatch, health, slots_free_after_s, watch_health, watch_resources

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


# ----------------------------------------------------------------------------- run


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


@dataclass
class Load:
    outcomes: list[Outcome]
    timeline: list[tuple[float, str]]  # /health's status changes
    seconds: float
    slots_free_after_s: float | None


async def load(
    client: httpx.AsyncClient,
    model: str,
    run_id: str,
    faults: list[Fault],
    watch: ResourceWatch,
    args: argparse.Namespace,
) -> Load:
    """The load itself: `--concurrency` workers, with faults injected and /health and resources watched."""
    finished, counter = asyncio.Event(), itertools.count()
    timeline: list[tuple[float, str]] = []
    outcomes: list[Outcome] = []
    inflight = 0
    t0 = watch.t0 = time.monotonic()

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

    background = [
        asyncio.create_task(watch_health(client, t0, finished, timeline)),
        asyncio.create_task(inject(faults, t0, finished)),
        asyncio.create_task(watch_resources(client, watch, args.sample_s, finished)),
    ]
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    seconds = time.monotonic() - t0
    finished.set()
    await asyncio.gather(*background)
    slots_free = await slots_free_after_s(client)
    watch.sample(await health(client))  # the last sample, at the end of the load
    for o in outcomes:  # times from the start of the load
        o.start, o.end = o.start - t0, o.end - t0
    return Load(outcomes, timeline, seconds, slots_free)


async def run(args: argparse.Namespace, watch: ResourceWatch, scorer: AnswerScorer | None) -> dict[str, Any]:
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
        done = await load(client, model, run_id, faults, watch, args)
    judged = verdicts([o for _, o in swept] + done.outcomes, refs, scorer, args.gap_tol)
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
        "load_seconds": round(done.seconds, 1),
        "requests_per_s": round(len(done.outcomes) / done.seconds, 2),
        **report(done.outcomes, judged, refs, faults, done.timeline, args.fault_window_s),
        "decoder_slots_free_after_s": done.slots_free_after_s,
        "health_timeline": done.timeline,
        "resources": {"growth": watch.growth(args.max_growth), "table": watch.table(), "samples": watch.samples},
    }
    return {"verdict": "fail" if failed(result) else "pass", **result}


def failed(result: dict[str, Any]) -> bool:
    """Crossed or unexplained answers, id mismatches or failures, a busy slot after, or memory grown."""
    checks = result["checks"]
    return bool(
        checks["crossed"] + checks["unexplained"] + checks["id_mismatches"] + result["unexplained_failures"]
        or result["drift_by_concurrency"]["bad"]
        or result["decoder_slots_free_after_s"] is None
        or any(g.get("ok") is False for g in result["resources"]["growth"].values())
    )


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
    parser.add_argument(
        "--serve", action="store_true", help="start the service (as the serve benchmark does) and stop it after"
    )
    parser.add_argument("--quantization", help="with --serve: the decoder's quantization (default: models.yaml's)")
    parser.add_argument(
        "--models-file", type=Path, default=ROOT / "models.yaml", help="the served models.yaml, for the answer check"
    )
    parser.add_argument("--no-teacher-forcing", action="store_true", help="skip the answer check's model")
    parser.add_argument("--gap-tol", type=float, default=DEFAULT_TOL, help="logits; see scripts/load/answer_check.py")
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
        from scripts.bench.tiny_models import SMALL_VLM, build_tiny_vlm

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

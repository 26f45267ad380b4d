"""What recording the service's metrics costs, measured on the recording itself.

    HF_HUB_OFFLINE=1 .venv/bin/python -m scripts.bench metrics

End-to-end throughput cannot show a cost this small on a machine whose run-to-run noise is 10% or
more, so the metric calls are timed where they run:

1. Decoder: models.yaml's first model inside the real `PrimaryDecoder` class, in a process joined to
   a local Ray instance (so metric calls go through Ray's core worker, as in a replica), serves
   `--rounds` rounds of `--concurrency` requests. Every metric call is timed (a `Recorder` whose
   methods add up their own duration, the engine slot's once-a-second gauges included) and the
   forward steps are counted at the batch's sampler (one call per step). Printed: metric time per
   request and per step, and its share of a step.
2. Ingress: `AccessLog.finish` (the access-log line, written to a file as Serve does, and the request
   counters) timed over `--records` records.
3. One interleaved throughput pair for the record: the same rounds with metrics on, then with a
   recorder that does nothing, alternating, `--pairs` times.

One JSON line per measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import time
from collections.abc import Mapping
from pathlib import Path

import ray

from deployments.config import Lifecycle, load_models_file
from deployments.engines.transformers import continuous
from deployments.monitoring.access_log import AccessLog, RequestRecord
from deployments.monitoring.metrics import INGRESS_METRICS, Recorder
from deployments.protocol.replica import GenerateRequest, TextMessage
from deployments.replicas.decoder import PrimaryDecoder
from scripts.bench.common import ROOT, arguments

QUESTIONS = ["What is the capital of Japan?", "Name a fruit that is red.", "Write a haiku about the sea."]


class TimedRecorder(Recorder):
    """The real recorder, with the time spent in its calls added up (`spent_s`, `calls`)."""

    def __init__(self, inner: Recorder) -> None:
        self._inner, self.spent_s, self.calls = inner, 0.0, 0

    def _timed(self, method: str, *args: object, **kwargs: object) -> None:
        start = time.perf_counter()
        getattr(self._inner, method)(*args, **kwargs)
        self.spent_s += time.perf_counter() - start
        self.calls += 1

    def inc(self, name: str, value: float = 1.0, tags: Mapping[str, str] | None = None) -> None:
        self._timed("inc", name, value, tags)

    def observe(self, name: str, value: float) -> None:
        self._timed("observe", name, value)

    def set(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        self._timed("set", name, value, tags)


class NoMetrics(Recorder):
    def __init__(self) -> None:
        pass

    def inc(self, name: str, value: float = 1.0, tags: Mapping[str, str] | None = None) -> None:
        pass

    def observe(self, name: str, value: float) -> None:
        pass

    def set(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        pass


STEPS = 0


def count_steps() -> None:
    """Count forward steps: the batch's sampler runs once per step."""
    sampler = continuous.PerRequestSampler
    call = sampler.__call__

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        global STEPS
        STEPS += 1
        return call(self, *args, **kwargs)

    sampler.__call__ = counted  # type: ignore[method-assign]


async def one(replica: PrimaryDecoder, i: int, max_tokens: int) -> int:
    text = QUESTIONS[i % len(QUESTIONS)] + " Context:" + " stone" * (i * 37 % 60)
    request = GenerateRequest(messages=[TextMessage(role="user", content=text)], max_tokens=max_tokens, temperature=0)
    tokens = 0
    async for chunk in replica.generate(request):
        tokens = chunk.completion_tokens or tokens
    return tokens


async def rounds(replica: PrimaryDecoder, args: argparse.Namespace) -> tuple[float, int, int]:
    """`(seconds, tokens, steps)` of `args.rounds` rounds of `args.concurrency` requests."""
    steps, start, tokens = STEPS, time.perf_counter(), 0
    for r in range(args.rounds):
        done = await asyncio.gather(
            *(one(replica, r * args.concurrency + i, args.max_tokens) for i in range(args.concurrency))
        )
        tokens += sum(done)
    return time.perf_counter() - start, tokens, STEPS - steps


def ingress_cost(records: int, log_path: Path) -> dict:
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(message)s"))
    logger = logging.getLogger("ray.serve")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    metrics = TimedRecorder(Recorder(INGRESS_METRICS, "bench"))
    log = AccessLog(lambda scope, receive, send: None, metrics=metrics, request_id=lambda scope: "x", routes=[])  # type: ignore[arg-type,return-value]
    scope = {"type": "http", "route": None, "path": "/v1/chat/completions"}
    start = time.perf_counter()
    for i in range(records):
        record = RequestRecord(request_id=f"req-{i}", method="POST", path="/v1/chat/completions", model="bench")
        record.status, record.prompt_tokens, record.completion_tokens, record.ttft_s = 200, 30, 64, 0.2
        record.images.accepted(b"x" * 1000, 4096)
        record.cache_hits = 1
        log.finish(record, scope)
    total_s = time.perf_counter() - start
    logger.removeHandler(handler)
    return {
        "what": "ingress per request",
        "finish_us": round(total_s / records * 1e6, 1),
        "metric_calls_us": round(metrics.spent_s / records * 1e6, 1),
        "metric_calls": metrics.calls / records,
    }


def main(argv: list[str] | None = None) -> None:
    asyncio.run(bench(argv))


async def bench(argv: list[str] | None) -> None:
    parser = arguments("metrics", __doc__)
    parser.add_argument("--models-file", type=Path, default=ROOT / "models.yaml")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--cpu-threads", type=int, default=2)
    args = parser.parse_args(argv)

    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    count_steps()
    model = load_models_file(args.models_file).models[0]
    params = model.params.model_copy(update={"cpu_threads": args.cpu_threads, "max_num_seqs": args.concurrency})
    model = model.model_copy(update={"params": params})
    replica = PrimaryDecoder.func_or_class(model, Lifecycle())  # type: ignore[attr-defined]
    real = replica.metrics
    await rounds(replica, argparse.Namespace(**{**vars(args), "rounds": 1}))  # warm-up

    timed = replica.metrics = TimedRecorder(real)
    seconds, tokens, steps = await rounds(replica, args)
    requests = args.rounds * args.concurrency
    step_s = seconds / steps
    per_step_s = timed.spent_s / steps
    print(
        json.dumps(
            {
                "what": f"decoder, concurrency {args.concurrency}",
                "requests": requests,
                "tokens": tokens,
                "seconds": round(seconds, 2),
                "steps": steps,
                "step_ms": round(step_s * 1e3, 2),
                "metric_calls": timed.calls,
                "metric_us_per_request": round(timed.spent_s / requests * 1e6, 1),
                "metric_us_per_step": round(per_step_s * 1e6, 2),
                "share_of_step_pct": round(100 * per_step_s / step_s, 4),
            }
        ),
        flush=True,
    )
    print(json.dumps(ingress_cost(args.records, Path(os.devnull))), flush=True)

    on, off = [], []
    for _ in range(args.pairs):
        for recorder, results in ((real, on), (NoMetrics(), off)):
            replica.metrics = recorder
            seconds, tokens, _ = await rounds(replica, args)
            results.append(tokens / seconds)
    print(
        json.dumps(
            {
                "what": "throughput, interleaved on/off",
                "on_tok_s": [round(x, 1) for x in on],
                "off_tok_s": [round(x, 1) for x in off],
                "on_over_off": round(statistics.median(on) / statistics.median(off), 3),
            }
        ),
        flush=True,
    )
    replica.stop()
    ray.shutdown()

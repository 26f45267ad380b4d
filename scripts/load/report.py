"""The load test's record of each request and its report: outcomes, isolation verdicts, drift
against concurrency, failures by class and by fault, latency.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from scripts.bench.common import pct
from scripts.load.answer_check import AnswerScorer, Reference, classify
from scripts.load.faults import Fault


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
    outcomes: list[Outcome],
    judged: dict,
    refs: dict[str, Reference],
    faults: list[Fault],
    timeline: list,
    fault_window_s: float,
) -> dict:
    ok, failed = [o for o in outcomes if not o.error], [o for o in outcomes if o.error]

    def explains(f: Fault, o: Outcome) -> bool:
        in_window = 0 <= o.end - f.at_s <= fault_window_s
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

"""The service's own metrics, recorded with `ray.serve.metrics` so that Ray's metrics export on
every node carries them (the endpoint the Ray dashboard's Prometheus scrapes) with Serve's
`application`, `deployment` and `replica` tags, plus `model`.

Every metric is declared once in `SPECS`: the recorders below create them, the Grafana dashboard
(`monitoring.dashboard`) and its test read the names from here. Names follow vLLM's where the
meaning is the same (`vllm:time_to_first_token_seconds` is `mmserve_time_to_first_token_seconds`),
with the unit in the name; Ray adds the `ray_` prefix on export and `_total` to counters.

Recording is per request and per second, never per token: a request costs about 15 metric calls
of ~6 us each (docs/benchmarks.md), and the gauges are set by the engine slot's 1 s tick.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from ray.serve import metrics

from deployments.protocol.openai.common import FinishReason, UnseenReason

Kind = Literal["counter", "gauge", "histogram"]

PREFIX = "mmserve_"

# Seconds, from a GPU's milliseconds to a CPU's minutes.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
ADMISSION_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


@dataclass(frozen=True)
class MetricSpec:
    """One metric's declaration: its name, kind, description, labels and histogram buckets."""

    name: str  # without PREFIX
    kind: Kind
    description: str
    tags: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    zeros: tuple[Mapping[str, str], ...] = field(default=({},), compare=False)
    """The label values (beside `model`) a counter or gauge is exported with at 0 from the start:
    its known ones; none where its values are only known where it is recorded."""

    @property
    def full_name(self) -> str:
        return PREFIX + self.name

    @property
    def exported(self) -> str:
        """The name in Prometheus' text format (Ray's prefix; `_total` on counters)."""
        return f"ray_{self.full_name}" + ("_total" if self.kind == "counter" else "")


def _spec(
    name: str,
    kind: Kind,
    description: str,
    *tags: str,
    buckets: tuple[float, ...] = (),
    known: Mapping[str, Sequence[str]] | None = None,
) -> MetricSpec:
    """`known`: each tag's known values, exported at 0 from the start (every combination)."""
    if known is None:
        zeros: tuple[Mapping[str, str], ...] = ({},) if not tags else ()
    else:
        keys = list(known)
        zeros = tuple(dict(zip(keys, values, strict=True)) for values in itertools.product(*known.values()))
    return MetricSpec(name, kind, description, tags, buckets, zeros)


DECODER_METRICS = (
    _spec(
        "time_to_first_token_seconds",
        "histogram",
        "Decoder: arrival at the replica to the first token.",
        buckets=LATENCY_BUCKETS,
    ),
    _spec(
        "time_per_output_token_seconds",
        "histogram",
        "Decoder: mean time between a request's output tokens after the first.",
        buckets=TOKEN_BUCKETS,
    ),
    _spec(
        "e2e_request_latency_seconds",
        "histogram",
        "Decoder: arrival at the replica to the last token.",
        buckets=LATENCY_BUCKETS,
    ),
    _spec(
        "request_queue_time_seconds",
        "histogram",
        "Decoder: time waiting for one of the replica's max_num_seqs slots.",
        buckets=LATENCY_BUCKETS,
    ),
    _spec(
        "prompt_tokens",
        "counter",
        "Decoder: prompt tokens of requests (cancelled requests included), those read from the prefix cache too.",
    ),
    _spec(
        "prompt_tokens_cached",
        "counter",
        "Decoder: prompt tokens read from the prefix cache instead of computed "
        "(enable_prefix_caching: llama.cpp, transformers static and continuous).",
    ),
    _spec("generation_tokens", "counter", "Decoder: tokens generated (cancelled requests included)."),
    _spec(
        "request_success",
        "counter",
        "Decoder: requests finished, by finish reason (stop, length).",
        "finished_reason",
        known={"finished_reason": get_args(FinishReason)},
    ),
    _spec("requests_cancelled", "counter", "Decoder: requests closed before they finished (client gone, deadline)."),
    _spec("num_requests_running", "gauge", "Decoder: sequences in the running batch."),
    _spec("num_requests_waiting", "gauge", "Decoder: requests waiting for a slot or for KV-cache pages."),
    _spec("kv_cache_usage_perc", "gauge", "Decoder: KV-cache pages in use / pages in total (0 to 1)."),
    _spec("processor_cache_hits", "counter", "Native vision: images whose processed tensors came from the cache."),
    _spec("processor_cache_misses", "counter", "Native vision: images the replica's processor processed."),
    _spec(
        "lora_adapter_loads",
        "counter",
        "LoRA: adapter loads on the replica, by outcome (loaded, failed: a 400; not_found: a 404).",
        "outcome",
        known={"outcome": ("loaded", "failed", "not_found")},
    ),
    _spec(
        "lora_adapter_load_seconds",
        "histogram",
        "LoRA: time to load an adapter (copy from storage, read, attach to the model).",
        buckets=LATENCY_BUCKETS,
    ),
    _spec("lora_adapters_held", "gauge", "LoRA: adapters the replica holds (at most max_adapters_per_replica)."),
)
CAPTIONER_METRICS = (
    _spec(
        "caption_latency_seconds",
        "histogram",
        "Captioner: one request's images, arrival to captions.",
        buckets=LATENCY_BUCKETS,
    ),
    _spec("caption_batch_size", "histogram", "Captioner: images per forward pass.", buckets=BATCH_BUCKETS),
    _spec("images_captioned", "counter", "Captioner: images captioned."),
    _spec(
        "caption_failures",
        "counter",
        "Captioner: failed caption requests, by kind (unavailable, oom, error).",
        "kind",
        known={"kind": ("unavailable", "oom", "error")},
    ),
)
EMBEDDER_METRICS = (
    _spec(
        "embed_latency_seconds",
        "histogram",
        "Embedder: one request's inputs, arrival to vectors.",
        buckets=LATENCY_BUCKETS,
    ),
    _spec("embed_batch_size", "histogram", "Embedder: inputs per forward pass.", buckets=BATCH_BUCKETS),
    _spec("embed_input_tokens", "counter", "Embedder: tokens embedded."),
)
ENGINE_METRICS = (
    _spec(
        "engine_loaded",
        "gauge",
        "1 when the replica's model is loaded and serving, else 0 (loading, failed, unloaded).",
        "role",
        known={},  # its one label, the replica's own role, is a tag of the replica's `Recorder`
    ),
)
INGRESS_METRICS = (
    _spec("http_requests", "counter", "Ingress: HTTP requests answered, by route and status code.", "route", "status"),
    _spec(
        "requests_rejected",
        "counter",
        "Ingress: requests answered with an error, by status and reason (the error's code or type).",
        "status",
        "reason",
    ),  # its known pairs: `errors.KNOWN_ERRORS`, exported by the ingress
    _spec(
        "requests_degraded",
        "counter",
        "Ingress: image requests answered without image descriptions, by reason.",
        "reason",
        known={"reason": get_args(UnseenReason)},
    ),
    _spec(
        "caption_cache_hits",
        "counter",
        "Ingress: images whose caption came from the cache (or an identical image in flight).",
    ),
    _spec("caption_cache_misses", "counter", "Ingress: images sent to the captioner."),
    _spec("caption_cache_entries", "gauge", "Ingress: captions held by this replica's cache."),
    _spec("caption_cache_bytes", "gauge", "Ingress: bytes held by this replica's caption cache."),
    _spec(
        "document_cache_hits",
        "counter",
        "Ingress: documents whose reading came from the cache (or an identical document being read).",
    ),
    _spec("document_cache_misses", "counter", "Ingress: documents read (PDF workers, text parts)."),
    _spec("document_cache_entries", "gauge", "Ingress: document readings held by this replica's cache."),
    _spec("document_cache_bytes", "gauge", "Ingress: bytes held by this replica's document cache."),
    _spec("image_bytes", "counter", "Ingress: bytes of images received (accepted images)."),
    _spec("image_pixels", "counter", "Ingress: pixels of images received (accepted images)."),
    _spec(
        "image_fetch_latency_seconds",
        "histogram",
        "Ingress: time to fetch an http(s) or file image URL.",
        buckets=LATENCY_BUCKETS,
    ),
    _spec(
        "image_fetch_failures",
        "counter",
        "Ingress: image URLs that could not be fetched, by scheme.",
        "scheme",
        known={"scheme": ("http", "https", "file")},
    ),
    # Per API key, by the name the limits file gives it (never the key; `default` for the others).
    _spec("key_requests", "counter", "Ingress: requests admitted to a model's endpoint, by API key name.", "key"),
    _spec(
        "key_rate_limited",
        "counter",
        "Ingress: requests refused with a 429, by API key name and the limit they met.",
        "key",
        "limit",
    ),
    _spec("key_prompt_tokens", "counter", "Ingress: prompt tokens of admitted requests, by API key name.", "key"),
    _spec(
        "key_completion_tokens", "counter", "Ingress: tokens generated for admitted requests, by API key name.", "key"
    ),
    _spec(
        "key_queue_time_seconds",
        "histogram",
        "Ingress: time a request waited for a place in the decoder's batch, by API key name.",
        "key",
        buckets=LATENCY_BUCKETS,
    ),
    _spec(
        "key_admission_seconds",
        "histogram",
        "Ingress: time the limits took to admit or refuse a request (the shared board's round trip), by API key name.",
        "key",
        buckets=ADMISSION_BUCKETS,
    ),
)
BATCH_METRICS = (
    _spec("batch_lines_queued", "gauge", "Batch runner: lines of running batches not yet sent."),
    _spec("batch_lines_running", "gauge", "Batch runner: lines sent and not yet answered."),
    _spec(
        "batch_lines_done",
        "counter",
        "Batch runner: lines finished, by outcome (completed: in the output file; failed: in the error file).",
        "outcome",
        known={"outcome": ("completed", "failed")},
    ),
)

# Recorded by the decoders' request router (`routing.PrefixRouter`), in the ingress replicas that hold
# the decoders' handles: with the ingress's Serve tags, and the decoder's `model`.
ROUTING_METRICS = (
    _spec(
        "routing_decisions",
        "counter",
        "Router: decoder requests routed, by decision (warm: to the replica holding the longest part of the "
        "prompt; session: the client's session hint; load_fallback: a warm replica was too busy; no_match).",
        "decision",
        known={"decision": ("warm", "session", "load_fallback", "no_match")},
    ),
    _spec(
        "routing_requests",
        "counter",
        "Router: decoder requests routed, by the decoder replica they went to (the imbalance between replicas).",
        "decoder_replica",
    ),
    _spec(
        "routing_load_spread",
        "gauge",
        "Router: at the last request routed, the busiest decoder replica's ongoing requests minus the least busy's.",
    ),
)

SPECS: tuple[MetricSpec, ...] = (
    DECODER_METRICS
    + CAPTIONER_METRICS
    + EMBEDDER_METRICS
    + ENGINE_METRICS
    + INGRESS_METRICS
    + BATCH_METRICS
    + ROUTING_METRICS
)


def _create(spec: MetricSpec, defaults: dict[str, str]) -> Any:
    tags: Any = ("model", *spec.tags)  # Ray's annotation says tuple[str], its code takes any tuple
    metric: Any
    if spec.kind == "counter":
        metric = metrics.Counter(spec.full_name, description=spec.description, tag_keys=tags)
    elif spec.kind == "gauge":
        metric = metrics.Gauge(spec.full_name, description=spec.description, tag_keys=tags)
    else:
        metric = metrics.Histogram(
            spec.full_name, description=spec.description, boundaries=list(spec.buckets), tag_keys=tags
        )
    metric.set_default_tags({key: value for key, value in defaults.items() if key in tags})
    return metric


class Recorder:
    """The metrics of `specs` for one model, recorded by short name: `inc("prompt_tokens", n)`.
    `tags`: values this recorder always records (e.g. its replica's `role`).
    """

    def __init__(self, specs: tuple[MetricSpec, ...], model: str, tags: Mapping[str, str] | None = None) -> None:
        self._specs = {spec.name: spec for spec in specs}
        self._tags = dict(tags or {})
        self._metrics: dict[str, Any] = {spec.name: _create(spec, {"model": model, **self._tags}) for spec in specs}

    def inc(self, name: str, value: float = 1.0, tags: Mapping[str, str] | None = None) -> None:
        if value:
            self._metrics[name].inc(value, tags=dict(tags) if tags else None)

    def observe(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        self._metrics[name].observe(value, tags=dict(tags) if tags else None)

    def set(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        self._metrics[name].set(value, tags=dict(tags) if tags else None)

    def export_zeros(
        self, models: Sequence[str] = (), more: Mapping[str, Iterable[Mapping[str, str]]] | None = None
    ) -> None:
        """Export every counter and gauge at 0 with its known label values (its spec's `zeros`, and
        `more` of them by metric name), for the recorder's model and `models`: a dashboard or an alert
        on a rate reads 0 from the start, not "no data" until the first event. Ray exports a series
        only once something is recorded, and its `Counter.inc` refuses 0, so the point is recorded
        directly.
        """
        more = more or {}
        for name, spec in self._specs.items():
            if spec.kind == "histogram":
                continue
            for labels in (*spec.zeros, *more.get(name, ())):
                for model in (None, *models):
                    tags = {**labels, **({"model": model} if model else {})}
                    if spec.kind == "counter":
                        self._metrics[name]._record(0, tags=tags or None)
                    else:
                        self._metrics[name].set(0, tags=tags or None)


class DecoderRequestTimer:
    """One request's timeline in the decoder replica; records its histograms and counters once."""

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder
        self.arrived = time.monotonic()
        self._first: float | None = None
        self.prompt_tokens = self.completion_tokens = 0
        self.cached_prompt_tokens = 0  # told on the last piece, by an engine with a prefix cache

    def admitted(self) -> float:
        """The request's place in the batch is granted: the seconds it waited for it."""
        queued = time.monotonic() - self.arrived
        self._recorder.observe("request_queue_time_seconds", queued)
        return queued

    def piece(self, prompt_tokens: int, completion_tokens: int) -> None:
        if self._first is None:
            self._first = time.monotonic()
            self._recorder.observe("time_to_first_token_seconds", self._first - self.arrived)
        self.prompt_tokens, self.completion_tokens = prompt_tokens, completion_tokens

    def finished(self, reason: str | None) -> None:
        """`reason`: the finish reason; None when closed before its end (cancelled); "error" when it failed
        (counted by the ingress as a rejection or an error).
        """
        now = time.monotonic()
        self._recorder.inc("prompt_tokens", self.prompt_tokens)
        self._recorder.inc("prompt_tokens_cached", self.cached_prompt_tokens)
        self._recorder.inc("generation_tokens", self.completion_tokens)
        if reason is None:
            self._recorder.inc("requests_cancelled")
        if reason in (None, "error"):
            return
        self._recorder.inc("request_success", tags={"finished_reason": reason})
        self._recorder.observe("e2e_request_latency_seconds", now - self.arrived)
        if self._first is not None and self.completion_tokens > 1:
            self._recorder.observe("time_per_output_token_seconds", (now - self._first) / (self.completion_tokens - 1))

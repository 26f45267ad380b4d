"""The Grafana dashboard's rows and panels over `metrics.SPECS`, declared the way Ray declares its
own (`ray/dashboard/modules/metrics/dashboards/serve_llm_dashboard_panels.py`): Ray's `Panel`,
`Target` and `Row`, each query's metric name taken from a `MetricSpec` (`spec.exported`), so that a
renamed or removed metric fails here or in tests/unit/test_dashboard.py instead of leaving an empty
panel. `dashboard.py` renders them."""

from __future__ import annotations

from typing import Any

from ray.dashboard.modules.metrics.dashboards.common import Panel, PanelTemplate, Row, Target, TargetTemplate

from deployments.monitoring.metrics import SPECS, MetricSpec

_SPECS = {spec.name: spec for spec in SPECS}

# Every series is narrowed by the dashboard's variables. `{global_filters}` stays last: Ray's
# factory formats each expr with str.format (hence the doubled braces below) and, when there are
# no global filters, drops the trailing comma this leaves.
_FILTER = 'application=~"$application", deployment=~"$deployment", model=~"$model", {global_filters}'
_QUANTILES = (0.5, 0.95, 0.99)


def _spec(name: str, kind: str | None = None) -> MetricSpec:
    if name not in _SPECS:
        raise KeyError(f"the dashboard reads {name!r}, which metrics.SPECS does not declare")
    spec = _SPECS[name]
    if kind and spec.kind != kind:
        raise ValueError(f"{spec.full_name} is a {spec.kind}, the dashboard reads it as a {kind}")
    return spec


def _series(spec: MetricSpec, suffix: str = "", matchers: str = "") -> str:
    """`spec`'s series under the dashboard's filters; `suffix`: a histogram's `_bucket`, `_sum`, `_count`."""
    return f"{spec.exported}{suffix}{{{{{matchers}{_FILTER}}}}}"


def _rate(name: str, by: str = "") -> str:
    rate = f"rate({_series(_spec(name, 'counter'))}[$interval])"
    return f"sum by ({by}) ({rate})" if by else f"sum({rate})"


def _gauge(name: str, by: str, agg: str = "sum") -> str:
    return f"{agg} by ({by}) ({_series(_spec(name, 'gauge'))})"


def _quantile_targets(name: str, by: str = "model") -> list[Target]:
    """p50/p95/p99 of a histogram over `$interval`, one line per `by` value."""
    buckets = _series(_spec(name, "histogram"), "_bucket")
    return [
        Target(
            expr=f"histogram_quantile({q}, sum by (le, {by}) (rate({buckets}[$interval])))",
            legend=f"p{round(q * 100)} {{{{{by}}}}}",
        )
        for q in _QUANTILES
    ]


def _panel(panel_id: int, title: str, name: str, unit: str, targets: list[Target], note: str = "", **kw: Any) -> Panel:
    """A panel whose description is its metric's own (metrics.py), then `note`."""
    description = " ".join(filter(None, [_spec(name).description, note]))
    return Panel(id=panel_id, title=title, description=description, unit=unit, targets=targets, **kw)


def _latency_panel(panel_id: int, title: str, name: str, by: str = "model") -> Panel:
    return _panel(panel_id, title, name, "s", _quantile_targets(name, by), fill=0, stack=False, linewidth=2)


OVERVIEW = [
    _panel(
        1,
        "HTTP requests / s by route and status",
        "http_requests",
        "reqps",
        [Target(expr=_rate("http_requests", "route, status"), legend="{{route}} {{status}}")],
    ),
    _panel(
        2,
        "Rejected requests / s by reason",
        "requests_rejected",
        "reqps",
        [Target(expr=_rate("requests_rejected", "status, reason"), legend="{{status}} {{reason}}")],
    ),
    _panel(
        3,
        "Degraded answers / s by reason",
        "requests_degraded",
        "reqps",
        [Target(expr=_rate("requests_degraded", "reason"), legend="{{reason}}")],
    ),
]

DECODER_PANELS = [
    _latency_panel(11, "Time to first token", "time_to_first_token_seconds"),
    _latency_panel(12, "Time per output token", "time_per_output_token_seconds"),
    _latency_panel(13, "End-to-end request latency", "e2e_request_latency_seconds"),
    _latency_panel(14, "Queue time", "request_queue_time_seconds"),
    _panel(
        15,
        "Prompt and generation tokens / s",
        "prompt_tokens",
        "tokens/s",
        [
            Target(expr=_rate("prompt_tokens", "model"), legend="prompt {{model}}"),
            Target(expr=_rate("prompt_tokens_cached", "model"), legend="prompt from the prefix cache {{model}}"),
            Target(expr=_rate("generation_tokens", "model"), legend="generation {{model}}"),
        ],
        note=_spec("generation_tokens").description,
    ),
    _panel(
        16,
        "Requests running and waiting",
        "num_requests_running",
        "short",
        [
            Target(expr=_gauge("num_requests_running", "replica"), legend="running {{replica}}"),
            Target(expr=_gauge("num_requests_waiting", "replica"), legend="waiting {{replica}}"),
        ],
        note=_spec("num_requests_waiting").description,
        stack=False,
        fill=1,
    ),
    _panel(
        17,
        "KV-cache usage",
        "kv_cache_usage_perc",
        "percentunit",
        [Target(expr=_gauge("kv_cache_usage_perc", "replica", agg="max"), legend="{{replica}}")],
        stack=False,
        fill=1,
        min_val=0,
        max_val=1,
    ),
    _panel(
        18,
        "Finished requests / s by finish reason",
        "request_success",
        "reqps",
        [Target(expr=_rate("request_success", "finished_reason"), legend="{{finished_reason}}")],
    ),
    _panel(
        19,
        "Cancelled requests / s",
        "requests_cancelled",
        "reqps",
        [Target(expr=_rate("requests_cancelled", "model"), legend="{{model}}")],
    ),
    _panel(
        26,
        "Prompt tokens from the prefix cache, share by replica",
        "prompt_tokens_cached",
        "percentunit",
        [
            Target(
                expr=f"sum by (replica) (rate({_series(_spec('prompt_tokens_cached', 'counter'))}[$interval])) / "
                f"sum by (replica) (rate({_series(_spec('prompt_tokens', 'counter'))}[$interval]))",
                legend="{{replica}}",
            )
        ],
        note="Warm sessions read most of their prompt from the cache: a replica well below the others is "
        "getting turns whose prefix another holds (docs/routing.md).",
        stack=False,
        fill=0,
        min_val=0,
        max_val=1,
    ),
    _panel(
        27,
        "Routing decisions / s",
        "routing_decisions",
        "reqps",
        [Target(expr=_rate("routing_decisions", "decision"), legend="{{decision}}")],
        note="Recorded by the ingress replicas (their deployment), labelled with the decoder's model.",
    ),
    _panel(
        28,
        "Requests routed / s by decoder replica, and the load spread",
        "routing_requests",
        "short",
        [
            Target(expr=_rate("routing_requests", "decoder_replica"), legend="{{decoder_replica}}"),
            Target(expr=_gauge("routing_load_spread", "model", agg="max"), legend="load spread {{model}}"),
        ],
        note=_spec("routing_load_spread").description,
        stack=False,
        fill=0,
    ),
]

# Bars per bucket over the dashboard's range, as Ray Data's histogram panels do (Grafana turns the
# cumulative `le` buckets into per-bucket counts).


def _batch_size_panel(panel_id: int, title: str, metric: str, items: str) -> Panel:
    """Forward passes by batch size: a histogram's cumulative `le` buckets as per-bucket counts."""
    buckets = _series(_spec(metric, "histogram"), "_bucket", 'le!="+Inf", ')
    return _panel(
        panel_id,
        title,
        metric,
        "short",
        [
            Target(
                expr=f"sum by (le) (increase({buckets}[$__range]))",
                legend=f"<= {{{{le}}}} {items}",
                template=TargetTemplate.HISTOGRAM_BAR_CHART,
            )
        ],
        note="Forward passes by batch size over the dashboard's time range.",
        fill=0,
        stack=False,
        template=PanelTemplate.BAR_CHART,
    )


CAPTIONER_PANELS = [
    _latency_panel(21, "Caption latency", "caption_latency_seconds"),
    _batch_size_panel(22, "Caption batch size", "caption_batch_size", "images"),
    _panel(
        23,
        "Images captioned / s",
        "images_captioned",
        "short",
        [Target(expr=_rate("images_captioned", "model"), legend="{{model}}")],
    ),
    _panel(
        24,
        "Caption failures / s by kind",
        "caption_failures",
        "reqps",
        [Target(expr=_rate("caption_failures", "kind"), legend="{{kind}}")],
    ),
    _panel(
        25,
        "Engines loaded by role",
        "engine_loaded",
        "short",
        [
            Target(
                expr=_gauge("engine_loaded", "role, model, replica", agg="max"), legend="{{role}} {{model}} {{replica}}"
            )
        ],
        stack=False,
        fill=0,
        linewidth=2,
        min_val=0,
        max_val=1,
    ),
]


EMBEDDER_PANELS = [
    _latency_panel(41, "Embedding latency", "embed_latency_seconds"),
    _batch_size_panel(42, "Embedding batch size", "embed_batch_size", "inputs"),
    _panel(
        43,
        "Tokens embedded / s",
        "embed_input_tokens",
        "short",
        [Target(expr=_rate("embed_input_tokens", "model"), legend="{{model}}")],
    ),
]

_hits = _rate("caption_cache_hits")
_misses = _rate("caption_cache_misses")

IMAGES_AND_CACHE = [
    _panel(
        31,
        "Caption cache hits and misses / s",
        "caption_cache_hits",
        "short",
        [Target(expr=_hits, legend="hits"), Target(expr=_misses, legend="misses")],
        note=_spec("caption_cache_misses").description,
    ),
    _panel(
        32,
        "Caption cache hit ratio",
        "caption_cache_hits",
        "percentunit",
        [Target(expr=f"{_hits} / ({_hits} + {_misses})", legend="hit ratio")],
        note="Hits / (hits + misses) over $interval.",
        stack=False,
        fill=1,
        min_val=0,
        max_val=1,
    ),
    _panel(
        33,
        "Caption cache entries",
        "caption_cache_entries",
        "short",
        [Target(expr=_gauge("caption_cache_entries", "replica"), legend="{{replica}}")],
    ),
    _panel(
        34,
        "Caption cache bytes",
        "caption_cache_bytes",
        "bytes",
        [Target(expr=_gauge("caption_cache_bytes", "replica"), legend="{{replica}}")],
    ),
    _panel(
        30,
        "Document cache hits and misses / s",
        "document_cache_hits",
        "short",
        [
            Target(expr=_rate("document_cache_hits"), legend="hits"),
            Target(expr=_rate("document_cache_misses"), legend="misses"),
        ],
        note=_spec("document_cache_misses").description,
    ),
    _panel(
        40,
        "Document cache entries",
        "document_cache_entries",
        "short",
        [Target(expr=_gauge("document_cache_entries", "replica"), legend="{{replica}}")],
    ),
    _panel(
        44,
        "Document cache bytes",
        "document_cache_bytes",
        "bytes",
        [Target(expr=_gauge("document_cache_bytes", "replica"), legend="{{replica}}")],
    ),
    _panel(
        35,
        "Image bytes / s",
        "image_bytes",
        "Bps",
        [Target(expr=_rate("image_bytes"), legend="bytes")],
    ),
    _panel(
        36,
        "Image pixels / s",
        "image_pixels",
        "short",
        [Target(expr=_rate("image_pixels"), legend="pixels")],
    ),
    _latency_panel(37, "Image fetch latency", "image_fetch_latency_seconds", by="deployment"),
    _panel(
        39,
        "Processor cache hits and misses / s (native vision)",
        "processor_cache_hits",
        "short",
        [
            Target(expr=_rate("processor_cache_hits"), legend="hits"),
            Target(expr=_rate("processor_cache_misses"), legend="misses"),
        ],
        note=_spec("processor_cache_misses").description,
    ),
    _panel(
        38,
        "Image fetch failures / s by scheme",
        "image_fetch_failures",
        "short",
        [Target(expr=_rate("image_fetch_failures", "scheme"), legend="{{scheme}}")],
    ),
]

BATCH_PANELS = [
    _panel(
        51,
        "Batch lines queued and running",
        "batch_lines_queued",
        "short",
        [
            Target(expr=_gauge("batch_lines_queued", "model"), legend="queued"),
            Target(expr=_gauge("batch_lines_running", "model"), legend="running"),
        ],
        note=_spec("batch_lines_running").description,
        stack=False,
        fill=1,
    ),
    _panel(
        52,
        "Batch lines done / s by outcome",
        "batch_lines_done",
        "short",
        [Target(expr=_rate("batch_lines_done", "outcome"), legend="{{outcome}}")],
    ),
]

LORA_PANELS = [
    _panel(
        61,
        "LoRA adapter loads / s by outcome",
        "lora_adapter_loads",
        "short",
        [Target(expr=_rate("lora_adapter_loads", "outcome"), legend="{{outcome}}")],
    ),
    _latency_panel(62, "LoRA adapter load time", "lora_adapter_load_seconds"),
    _panel(
        63,
        "LoRA adapters held by replica",
        "lora_adapters_held",
        "short",
        [Target(expr=_gauge("lora_adapters_held", "replica", agg="max"), legend="{{replica}}")],
        stack=False,
        fill=0,
    ),
]

KEY_PANELS = [
    _panel(
        71,
        "Requests / s by API key",
        "key_requests",
        "short",
        [Target(expr=_rate("key_requests", "key"), legend="{{key}}")],
        note="Requests admitted to a model's endpoint, by the key's name in the limits file (default: the others).",
    ),
    _panel(
        72,
        "Rate-limited (429) / s by API key and limit",
        "key_rate_limited",
        "short",
        [Target(expr=_rate("key_rate_limited", "key, limit"), legend="{{key}} {{limit}}")],
    ),
    _panel(
        73,
        "Tokens / s by API key",
        "key_prompt_tokens",
        "short",
        [
            Target(expr=_rate("key_prompt_tokens", "key"), legend="prompt {{key}}"),
            Target(expr=_rate("key_completion_tokens", "key"), legend="completion {{key}}"),
        ],
        note=_spec("key_completion_tokens").description,
    ),
    _latency_panel(74, "Queue time by API key", "key_queue_time_seconds", by="key"),
    _latency_panel(75, "Limits admission time by API key", "key_admission_seconds", by="key"),
]

ROWS = [
    Row(title="Overview", id=100, panels=OVERVIEW),
    Row(title="Decoder", id=101, panels=DECODER_PANELS),
    Row(title="Captioner", id=102, panels=CAPTIONER_PANELS),
    Row(title="Images and cache", id=103, panels=IMAGES_AND_CACHE),
    Row(title="Embeddings", id=104, panels=EMBEDDER_PANELS),
    Row(title="Batches", id=105, panels=BATCH_PANELS),
    Row(title="LoRA adapters", id=106, panels=LORA_PANELS),
    Row(title="API keys", id=107, panels=KEY_PANELS),
]

_ids = [row.id for row in ROWS] + [panel.id for row in ROWS for panel in row.panels]
if len(_ids) != len(set(_ids)):
    raise ValueError(f"duplicate panel or row id: {sorted(_ids)}")

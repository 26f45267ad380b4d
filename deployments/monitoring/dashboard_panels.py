"""The Grafana dashboard's rows and panels over `metrics.SPECS`, declared the way Ray declares its
own (`ray/dashboard/modules/metrics/dashboards/serve_llm_dashboard_panels.py`): Ray's `Panel`,
`Target` and `Row`, each query's metric name taken from a `MetricSpec` (`panel_parts`), so that a
renamed or removed metric fails here or in tests/unit/test_dashboard.py instead of leaving an empty
panel. `dashboard.py` renders them.
"""

from __future__ import annotations

from ray.dashboard.modules.metrics.dashboards.common import Panel, PanelTemplate, Row, Target, TargetTemplate

from deployments.monitoring.panel_parts import (
    gauge,
    hits_panel,
    latency_panel,
    panel,
    rate,
    series,
    size_panels,
    spec,
)

OVERVIEW = [
    panel(
        1,
        "HTTP requests / s by route and status",
        "http_requests",
        "reqps",
        [Target(expr=rate("http_requests", "route, status"), legend="{{route}} {{status}}")],
    ),
    panel(
        2,
        "Rejected requests / s by reason",
        "requests_rejected",
        "reqps",
        [Target(expr=rate("requests_rejected", "status, reason"), legend="{{status}} {{reason}}")],
    ),
    panel(
        3,
        "Degraded answers / s by reason",
        "requests_degraded",
        "reqps",
        [Target(expr=rate("requests_degraded", "reason"), legend="{{reason}}")],
    ),
]

DECODER_PANELS = [
    latency_panel(11, "Time to first token", "time_to_first_token_seconds"),
    latency_panel(12, "Time per output token", "time_per_output_token_seconds"),
    latency_panel(13, "End-to-end request latency", "e2e_request_latency_seconds"),
    latency_panel(14, "Queue time", "request_queue_time_seconds"),
    panel(
        15,
        "Prompt and generation tokens / s",
        "prompt_tokens",
        "tokens/s",
        [
            Target(expr=rate("prompt_tokens", "model"), legend="prompt {{model}}"),
            Target(expr=rate("prompt_tokens_cached", "model"), legend="prompt from the prefix cache {{model}}"),
            Target(expr=rate("generation_tokens", "model"), legend="generation {{model}}"),
        ],
        note=spec("generation_tokens").description,
    ),
    panel(
        16,
        "Requests running and waiting",
        "num_requests_running",
        "short",
        [
            Target(expr=gauge("num_requests_running", "replica"), legend="running {{replica}}"),
            Target(expr=gauge("num_requests_waiting", "replica"), legend="waiting {{replica}}"),
        ],
        note=spec("num_requests_waiting").description,
        stack=False,
        fill=1,
    ),
    panel(
        17,
        "KV-cache usage",
        "kv_cache_usage_perc",
        "percentunit",
        [Target(expr=gauge("kv_cache_usage_perc", "replica", agg="max"), legend="{{replica}}")],
        stack=False,
        fill=1,
        min_val=0,
        max_val=1,
    ),
    panel(
        18,
        "Finished requests / s by finish reason",
        "request_success",
        "reqps",
        [Target(expr=rate("request_success", "finished_reason"), legend="{{finished_reason}}")],
    ),
    panel(
        19,
        "Cancelled requests / s",
        "requests_cancelled",
        "reqps",
        [Target(expr=rate("requests_cancelled", "model"), legend="{{model}}")],
    ),
    panel(
        26,
        "Prompt tokens from the prefix cache, share by replica",
        "prompt_tokens_cached",
        "percentunit",
        [
            Target(
                expr=f"sum by (replica) (rate({series(spec('prompt_tokens_cached', 'counter'))}[$interval])) / "
                f"sum by (replica) (rate({series(spec('prompt_tokens', 'counter'))}[$interval]))",
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
    panel(
        27,
        "Routing decisions / s",
        "routing_decisions",
        "reqps",
        [Target(expr=rate("routing_decisions", "decision"), legend="{{decision}}")],
        note="Recorded by the ingress replicas (their deployment), labelled with the decoder's model.",
    ),
    panel(
        28,
        "Requests routed / s by decoder replica, and the load spread",
        "routing_requests",
        "short",
        [
            Target(expr=rate("routing_requests", "decoder_replica"), legend="{{decoder_replica}}"),
            Target(expr=gauge("routing_load_spread", "model", agg="max"), legend="load spread {{model}}"),
        ],
        note=spec("routing_load_spread").description,
        stack=False,
        fill=0,
    ),
]

# Bars per bucket over the dashboard's range, as Ray Data's histogram panels do (Grafana turns the
# cumulative `le` buckets into per-bucket counts).


def _batch_size_panel(panel_id: int, title: str, metric: str, items: str) -> Panel:
    """Forward passes by batch size: a histogram's cumulative `le` buckets as per-bucket counts."""
    buckets = series(spec(metric, "histogram"), "_bucket", 'le!="+Inf", ')
    return panel(
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
    latency_panel(21, "Caption latency", "caption_latency_seconds"),
    _batch_size_panel(22, "Caption batch size", "caption_batch_size", "images"),
    panel(
        23,
        "Images captioned / s",
        "images_captioned",
        "short",
        [Target(expr=rate("images_captioned", "model"), legend="{{model}}")],
    ),
    panel(
        24,
        "Caption failures / s by kind",
        "caption_failures",
        "reqps",
        [Target(expr=rate("caption_failures", "kind"), legend="{{kind}}")],
    ),
    panel(
        25,
        "Engines loaded by role",
        "engine_loaded",
        "short",
        [
            Target(
                expr=gauge("engine_loaded", "role, model, replica", agg="max"), legend="{{role}} {{model}} {{replica}}"
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
    latency_panel(41, "Embedding latency", "embed_latency_seconds"),
    _batch_size_panel(42, "Embedding batch size", "embed_batch_size", "inputs"),
    panel(
        43,
        "Tokens embedded / s",
        "embed_input_tokens",
        "short",
        [Target(expr=rate("embed_input_tokens", "model"), legend="{{model}}")],
    ),
]

_hits = rate("caption_cache_hits")
_misses = rate("caption_cache_misses")

IMAGES_AND_CACHE = [
    panel(
        31,
        "Caption cache hits and misses / s",
        "caption_cache_hits",
        "short",
        [Target(expr=_hits, legend="hits"), Target(expr=_misses, legend="misses")],
        note=spec("caption_cache_misses").description,
    ),
    panel(
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
    *size_panels(33, 34, "Caption cache", "caption_cache"),
    hits_panel(30, "Document cache hits and misses / s", "document_cache"),
    *size_panels(40, 44, "Document cache", "document_cache"),
    panel(
        35,
        "Image bytes / s",
        "image_bytes",
        "Bps",
        [Target(expr=rate("image_bytes"), legend="bytes")],
    ),
    panel(
        36,
        "Image pixels / s",
        "image_pixels",
        "short",
        [Target(expr=rate("image_pixels"), legend="pixels")],
    ),
    latency_panel(37, "Image fetch latency", "image_fetch_latency_seconds", by="deployment"),
    hits_panel(39, "Processor cache hits and misses / s (native vision)", "processor_cache"),
    panel(
        38,
        "Image fetch failures / s by scheme",
        "image_fetch_failures",
        "short",
        [Target(expr=rate("image_fetch_failures", "scheme"), legend="{{scheme}}")],
    ),
]

BATCH_PANELS = [
    panel(
        51,
        "Batch lines queued and running",
        "batch_lines_queued",
        "short",
        [
            Target(expr=gauge("batch_lines_queued", "model"), legend="queued"),
            Target(expr=gauge("batch_lines_running", "model"), legend="running"),
        ],
        note=spec("batch_lines_running").description,
        stack=False,
        fill=1,
    ),
    panel(
        52,
        "Batch lines done / s by outcome",
        "batch_lines_done",
        "short",
        [Target(expr=rate("batch_lines_done", "outcome"), legend="{{outcome}}")],
    ),
]

LORA_PANELS = [
    panel(
        61,
        "LoRA adapter loads / s by outcome",
        "lora_adapter_loads",
        "short",
        [Target(expr=rate("lora_adapter_loads", "outcome"), legend="{{outcome}}")],
    ),
    latency_panel(62, "LoRA adapter load time", "lora_adapter_load_seconds"),
    panel(
        63,
        "LoRA adapters held by replica",
        "lora_adapters_held",
        "short",
        [Target(expr=gauge("lora_adapters_held", "replica", agg="max"), legend="{{replica}}")],
        stack=False,
        fill=0,
    ),
]

KEY_PANELS = [
    panel(
        71,
        "Requests / s by API key",
        "key_requests",
        "short",
        [Target(expr=rate("key_requests", "key"), legend="{{key}}")],
        note="Requests admitted to a model's endpoint, by the key's name in the limits file (default: the others).",
    ),
    panel(
        72,
        "Rate-limited (429) / s by API key and limit",
        "key_rate_limited",
        "short",
        [Target(expr=rate("key_rate_limited", "key, limit"), legend="{{key}} {{limit}}")],
    ),
    panel(
        73,
        "Tokens / s by API key",
        "key_prompt_tokens",
        "short",
        [
            Target(expr=rate("key_prompt_tokens", "key"), legend="prompt {{key}}"),
            Target(expr=rate("key_completion_tokens", "key"), legend="completion {{key}}"),
        ],
        note=spec("key_completion_tokens").description,
    ),
    latency_panel(74, "Queue time by API key", "key_queue_time_seconds", by="key"),
    latency_panel(75, "Limits admission time by API key", "key_admission_seconds", by="key"),
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

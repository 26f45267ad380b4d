"""The Serve options of every deployment: set here, by the builder, from the configuration, a module
per concern: `naming` (deployment names), `layout` (placement: GPU shares, CPU replicas and their
threads, the engine `auto` resolves to; the decoder's and the captioner's whole options), `scaling`
(queue bounds and autoscaling) and `replica` (the replica processes' environment and draining).

The deployment classes carry none, so that tests and production run with the same limits. A
model's ``deployment:`` section in models.yaml sets its queue bounds; `serve_config.yaml` may still
override any option (Serve applies its ``deployments:`` entries over these).

- Ingress: a cheap async router, autoscaled on open connections, with no CPU reserved.
Several primaries (models.yaml `primaries`) get a decoder each, named by `deployment_name`, their
GPU share from `model_gpus`; on CPU `build_app` gives each its part of the cores and of the CPU.

- PrimaryDecoder: placed by `decoder_layout` (GPU autoscaling, or a set of CPU replicas sharing
  the cores: fixed, or autoscaled when the model's `deployment.autoscaling` is given; how many, and
  their threads, by the engine's spec in `deployments/engines/registry.py`), which also
  resolves its `engine: auto` from that placement (`registry.resolved`); it takes up
  to twice `max_num_seqs` requests (one batch running, one waiting in the replica) and never fewer
  than `max_num_seqs`.
- TextEmbedder (one per embedding model, `embedder_options`): on CPU one replica that reserves no Ray
  CPU (it shares the cores, as the ingress does); with a GPU share, 1 to 2 replicas autoscaled on
  ongoing requests; `deployment.autoscaling` applies as for the others.
- VisionCaptioner: one CPU and a GPU share, autoscaled on ongoing captioning calls, its `engine:
  auto` resolved from that share (`placed_captioner`); without a GPU share, one replica (a second
  on the same cores adds no throughput, and when decoder replicas crash it can take the CPU their
  replacements need: measured, a 5-minute decoder outage in the soak, docs/reliability.md) unless
  `deployment.autoscaling` says otherwise (e.g. `min_replicas: 0`, scale to zero). With no
  captioner configured, one CPU replica that only says so, behind the same queue bounds.

Autoscaling (`scaling`): a model's `deployment.autoscaling` (`AutoscalingConfig`) becomes Serve's
`autoscaling_config`, its unset fields filled with the defaults of the model's role, which are
what the builder used before the section existed: so without the section nothing changes.

Every queue is bounded: beyond `max_queued_requests`, callers get a 503 with Retry-After at once,
and a crashed model replica is noticed (and replaced) within `HEALTH_CHECK_S`.

Replica processes (`for_replicas`, applied last to every deployment): the environment variables they
need (`REPLICA_ENV`), merged under the application's runtime_env, and a graceful shutdown as long as
a call's deadline, so that a redeploy or a downscale lets requests in flight finish.
"""

from deployments.options.layout import (
    SHARED_GPU,
    captioner_options,
    cpu_decoders,
    decoder_layout,
    decoder_options,
    embedder_options,
    gpus,
    model_gpus,
    placed_captioner,
)
from deployments.options.naming import deployment_name
from deployments.options.replica import (
    DRAIN_MARGIN_S,
    REPLICA_ENV,
    SAME_LOOP,
    application_runtime_env,
    for_replicas,
)
from deployments.options.scaling import (
    BACKPRESSURE,
    BATCH_RUNNER_OPTIONS,
    CAPTIONER_ONGOING,
    CAPTIONER_TARGET,
    GPU_CAPTIONERS,
    GPU_DECODERS,
    HEALTH_CHECK_S,
    INGRESS_OPTIONS,
    QUEUED,
    queue_bounds,
    scaling,
)

__all__ = [
    "BACKPRESSURE",
    "BATCH_RUNNER_OPTIONS",
    "CAPTIONER_ONGOING",
    "CAPTIONER_TARGET",
    "DRAIN_MARGIN_S",
    "GPU_CAPTIONERS",
    "GPU_DECODERS",
    "HEALTH_CHECK_S",
    "INGRESS_OPTIONS",
    "QUEUED",
    "REPLICA_ENV",
    "SAME_LOOP",
    "SHARED_GPU",
    "application_runtime_env",
    "captioner_options",
    "cpu_decoders",
    "decoder_layout",
    "decoder_options",
    "deployment_name",
    "embedder_options",
    "for_replicas",
    "gpus",
    "model_gpus",
    "placed_captioner",
    "queue_bounds",
    "scaling",
]

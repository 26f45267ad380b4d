"""How the models are served: the file-level `server:` section, a model's `deployment:` (with its
`autoscaling:`), and the application builder's arguments.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    model_validator,
)

from deployments.config.batches import BatchesConfig
from deployments.config.embedding import EmbeddingConfig
from deployments.config.params import EngineParams
from deployments.config.routing import RoutingConfig
from deployments.config.state import StateConfig, moved_settings
from deployments.config.strict import StrictModel
from deployments.config.vision import VisionMode


class ServerConfig(StrictModel):
    """HTTP-level limits and access of the ingress (the ``server:`` section of models.yaml)."""

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        return moved_settings(data)

    api_keys: list[Annotated[str, Field(min_length=8)]] = Field(
        default_factory=list,
        description="Accepted API keys (`Authorization: Bearer <key>`). With none here and none in "
        "api_keys_env, the API is open. /health is always open.",
    )
    api_keys_env: str | None = Field(
        "MMSERVE_API_KEYS",
        description="Environment variable holding more accepted keys, comma-separated; read by each ingress "
        "replica when it starts, so keys need not be written in files.",
    )
    max_body_bytes: int = Field(
        32 * 1024 * 1024, gt=0, description="Largest request body; 413 beyond (a 20 MB image is 27 MB as base64)."
    )
    request_timeout_s: float = Field(
        300.0,
        gt=0,
        description="Deadline of one chat request, captions and generation included: 408 before the response "
        "starts, an error event after; either way the generation is cancelled.",
    )
    max_n: int = Field(
        8, ge=1, le=128, description="Most choices (`n`) one request may ask for; each is a sequence in the batch."
    )
    state: StateConfig = Field(
        default_factory=StateConfig,
        description="Where files, batches, stored responses and conversations are kept (the storage root), and "
        "the bounds of stored responses and conversations.",
    )
    batches: BatchesConfig = Field(
        default_factory=BatchesConfig,
        description="The Files and Batch APIs (/v1/files, /v1/batches): storage root, caps and the runner's "
        "concurrency.",
    )


class AutoscalingConfig(StrictModel):
    """Replica autoscaling of a model's deployment (``deployment.autoscaling``), on ongoing requests:
    Serve keeps each replica near `target_ongoing_requests` (running and waiting requests, averaged
    over `look_back_period_s`), between `min_replicas` and `max_replicas`. The builder maps it into
    Serve's ``autoscaling_config`` (deployments/options/), filling the fields left unset with the
    default of the model's role, and checks the result there (min <= initial <= max once filled, a
    CPU decoder's replicas within the cores, the decoder never at zero).
    """

    min_replicas: int = Field(
        1,
        ge=0,
        description="Fewest replicas. 0 (the captioner only): no replica while idle; the next image request "
        "starts one and waits for it at most proxy_vision.timeout_s, then degrades per proxy_vision.on_failure.",
    )
    max_replicas: int | None = Field(
        None,
        gt=0,
        description="Most replicas. Default: a GPU decoder 2; a CPU decoder decoder_cpu_replicas (auto: 1 on "
        "llama.cpp, 2 on 2+ cores on transformers), each with cores / max_replicas threads under cpu_threads: "
        "all, never more than the cores; a captioner 2 with a GPU share, 1 on CPU.",
    )
    initial_replicas: int | None = Field(
        None, ge=0, description="Replicas started at deploy time. Default: min_replicas."
    )
    target_ongoing_requests: float | None = Field(
        None,
        gt=0,
        description="Ongoing requests per replica that Serve scales to keep: those a replica runs and those "
        "waiting for one in a handle's queue. Default: the decoder's max_num_seqs (a new replica when the batch "
        "is full); the captioner's 4. Above max_ongoing_requests, requests queue before a replica is added.",
    )
    upscale_delay_s: float = Field(
        30.0, ge=0, description="How long the load must call for more replicas before one is added."
    )
    downscale_delay_s: float = Field(
        600.0,
        ge=0,
        description="How long the load must call for fewer replicas before one is removed (loading a model is slow).",
    )
    downscale_to_zero_delay_s: float | None = Field(
        None, ge=0, description="With min_replicas 0: the delay from one replica to none. Default: downscale_delay_s."
    )
    look_back_period_s: float = Field(
        30.0, gt=0, description="Window over which each replica's ongoing requests are averaged."
    )
    metrics_interval_s: float = Field(
        10.0,
        gt=0,
        description="How often replicas and handles report their load to Serve's controller, so about the lag of "
        "every decision. Ray 2.60 marks this field deprecated (to become environment variables) but still reads it. "
        "Must be below look_back_period_s.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingConfig:
        if self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})")
        if self.initial_replicas is not None:
            if self.initial_replicas < self.min_replicas:
                raise ValueError(
                    f"initial_replicas ({self.initial_replicas}) is below min_replicas ({self.min_replicas})"
                )
            if self.max_replicas is not None and self.initial_replicas > self.max_replicas:
                raise ValueError(
                    f"initial_replicas ({self.initial_replicas}) is above max_replicas ({self.max_replicas})"
                )
        if self.downscale_to_zero_delay_s is not None and self.min_replicas != 0:
            raise ValueError("downscale_to_zero_delay_s applies only with min_replicas: 0")
        if self.look_back_period_s <= self.metrics_interval_s:
            raise ValueError(
                f"look_back_period_s ({self.look_back_period_s:g}) must be above metrics_interval_s "
                f"({self.metrics_interval_s:g}): the window must hold more than one report"
            )
        return self


class DeploymentConfig(StrictModel):
    """Serve options of a model's deployment (the ``deployment:`` section of its entry). Unset ones
    take the builder's default for the model's role (deployments/options/); serve_config.yaml may
    still override any of them.
    """

    max_ongoing_requests: int | None = Field(
        None,
        gt=0,
        description="Requests one replica takes at once. Decoder default: twice max_num_seqs (a full batch "
        "running, another waiting in the replica), four times with a limits_file (requests wait in the replica, "
        "where the keys share the queue fairly, rather than first come first served in Serve's); the builder "
        "refuses less than max_num_seqs. Captioner: 16.",
    )
    max_queued_requests: int | None = Field(
        None, gt=0, description="Requests waiting for a replica; beyond them, 503 with Retry-After. Default: 64."
    )
    num_gpus: Annotated[float, Field(ge=0)] | Literal["auto"] | None = Field(
        None,
        description="GPUs per replica (0.5: two models packed on one card; 1: a card each; 0: CPU). null: the "
        "builder arg decoder_gpus or captioner_gpus (auto: 0.5 when the cluster has GPUs, else CPU).",
    )
    autoscaling: AutoscalingConfig | None = Field(
        None,
        description="Replica autoscaling on ongoing requests. null: the builder's placement (a GPU decoder "
        "scales from 1 to 2 replicas on max_num_seqs, 30 s up, 600 s down; a CPU decoder runs "
        "decoder_cpu_replicas fixed replicas; a captioner scales from 1 to 2 on 4 with a GPU share, 1 replica "
        "on CPU). Given (even {}): these replicas autoscale, with the unset fields at those defaults.",
    )
    routing: RoutingConfig = Field(
        default_factory=RoutingConfig,
        description="A decoder's request router: which replica each request goes to (docs/routing.md).",
    )


GpuShare = float | Literal["auto"]


class AppArgs(StrictModel):
    """Arguments of `build_app` / `build_captioner_app` (serve_config.yaml `args:` or CLI key=value).

    Dotted CLI keys nest: ``decoder.max_tokens=64`` is ``{"decoder": {"max_tokens": 64}}``.
    """

    models_file: str = Field("models.yaml", description="Path of models.yaml.")
    limits_file: str | None = Field(
        None,
        description="Path of the limits file: named API keys with their rate limits, token budgets, models and "
        "priority, and the default for other keys (docs/limits.md). Edits take effect within seconds. "
        "None: no limits (any accepted key may do anything).",
    )
    model: str | None = Field(
        None, description="Serve this models.yaml entry alone. Default: the file's `primaries` (else its first entry)."
    )
    vision_mode: VisionMode | None = Field(None, description="Overrides every primary's vision_mode.")
    on_image_failure: Literal["degrade", "reject"] | None = Field(
        None, description="Overrides proxy_vision.on_failure."
    )
    decoder: EngineParams = Field(
        default_factory=EngineParams, description="Overrides of every primary's params (only the fields given)."
    )
    captioner: EngineParams = Field(
        default_factory=EngineParams, description="Overrides of every captioner's params (only the fields given)."
    )
    embedder: EmbeddingConfig = Field(
        default_factory=EmbeddingConfig,
        description="Overrides of every embedding model's `embedding:` section (only the fields given).",
    )
    embedder_gpus: GpuShare = Field(
        0.0,
        description="num_gpus per embedding replica unless its deployment.num_gpus says; default 0: CPU (auto: "
        "half a GPU when the cluster has GPUs).",
    )
    captioner_app: str = Field("vision", description="Serve application that runs the captioner.")
    decoder_gpus: GpuShare = Field("auto", description="num_gpus per decoder replica; auto: 0.5 with GPUs.")
    captioner_gpus: GpuShare = Field("auto", description="num_gpus per captioner replica.")
    decoder_cpu_replicas: Annotated[int, Field(gt=0)] | Literal["auto"] = Field(
        "auto",
        description="Decoder replicas when the decoder runs on CPU; with cpu_threads: all they share the "
        "cores. auto: by the decoder's engine: llama.cpp 1 (it batches its slots in one process, on threads over "
        "every core); transformers 2 on a machine with 2 or more cores, else 1. Under deployment.autoscaling, "
        "the default max_replicas.",
    )
    revision: str | int | None = Field(
        None,
        description="Read by nothing: `serve deploy` rebuilds an application only when its entry in the "
        "config changes, so bump this after editing models.yaml to have it read again (a rolling restart).",
    )

    @model_validator(mode="before")
    @classmethod
    def _nest_dotted_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        nested: dict[str, Any] = {}
        for key, value in data.items():
            head, _, rest = str(key).partition(".")
            if rest:
                nested.setdefault(head, {})[rest] = value
            else:
                nested[head] = value
        return nested

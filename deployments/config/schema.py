"""Typed mirror of ``models.yaml`` and of the application builder's arguments.

Every section forbids unknown keys and every field has a default and a description. The checks of
one field, section or entry are here (types and bounds; exactly one of hf_id and local_path; int4-cpu
with a bfloat16 dtype; prompt_template fields; a captioner for proxy vision; the moved vision_proxy
settings; `fake:` only with `engine: fake`), and so are duplicate model names (`ModelsFile._unique_names`).
What needs the file on disk, the builder args or other entries (paths exist, the primary named by
`model`, `captioning:` only on a captioner's entry) is checked in `loading`; a decoder's
`max_ongoing_requests` against its `max_num_seqs`, and `deployment.autoscaling` once the role's
defaults fill it, in `deployments/options.py`.
"""

from __future__ import annotations

import ipaddress
import string
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _vision_mode(value: Any) -> Any:
    # YAML users write `vision_mode: false` or `none`; both mean disabled.
    if value is None or value is False or (isinstance(value, str) and value.lower() in {"none", "false", "off"}):
        return "disabled"
    return value


VisionMode = Annotated[Literal["disabled", "proxy", "native"], BeforeValidator(_vision_mode)]


class EngineParams(_Strict):
    """Engine settings of one model. Every field has a default."""

    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto", description="Weights dtype. auto: bfloat16 on a GPU that supports it, else float32."
    )
    quantization: Literal["none", "bnb-4bit", "bnb-8bit", "int4-cpu"] = Field(
        "none",
        description="On-the-fly quantization after loading. bnb-4bit, bnb-8bit: bitsandbytes, CUDA only. "
        "int4-cpu: weight-only int4 in groups of 32 with bfloat16 activations (torch's CPU kernel), "
        "every linear layer but the output embedding, whose top logits are recomputed in float32; keeps a "
        "GGUF Q4 file's weights at 4 bits. On a GPU replica it does nothing (logged): use bnb-4bit there.",
    )
    device_ids: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list,
        description="GPU indices among those Ray assigned to the replica. Empty: all assigned GPUs "
        "(the model is sharded over them when there are several); CPU when there are none.",
    )
    batching: Literal["continuous", "sequential"] = Field(
        "continuous",
        description="continuous: one paged-attention batch per replica that requests join and leave at every "
        "step. sequential: one generate() per request; slower, but supports seed and penalties.",
    )
    mem: int | None = Field(
        None,
        gt=0,
        description="KV-cache memory budget in MB (continuous batching). Default: room for max_num_seqs "
        "sequences of max_model_len tokens.",
    )
    max_num_seqs: int = Field(8, gt=0, description="Sequences decoded concurrently by one replica.")
    prefill_chunk_size: int | None = Field(
        None, gt=0, description="Most tokens per batching step (prompt chunks + decodes). Default: 512."
    )
    cpu_threads: Annotated[int, Field(gt=0)] | Literal["all"] | None = Field(
        None,
        description="torch threads on CPU: a number, all (the cores; a decoder shares them among its CPU "
        "replicas), or null (Ray's num_cpus).",
    )
    max_model_len: int | None = Field(
        None, gt=0, description="Context length (prompt + completion). Default: the model's own."
    )
    context_overflow: Literal["error", "truncate"] = Field(
        "error",
        description="A chat that does not fit max_model_len with its max_tokens (the request's, else the default). "
        "error: a 400 context_length_exceeded with the numbers (the default max_tokens is first cut to the "
        "context left). truncate: the oldest turns (a user message and the assistant and tool messages answering "
        "it) are dropped whole until it fits; system messages and the last user turn are always kept, and an "
        "image (its placeholder run or its caption) is never cut; usage.truncated_prompt_tokens says how many "
        "prompt tokens were dropped; a 400 when even those do not fit. A legacy completion's prompt is never cut.",
    )
    temperature: float = Field(0.7, ge=0, le=2, description="Default sampling temperature; 0 = greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Default nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Default top-k; 0 disables it.")
    frequency_penalty: float = Field(0.0, ge=-2, le=2, description="Default OpenAI frequency penalty.")
    presence_penalty: float = Field(0.0, ge=-2, le=2, description="Default OpenAI presence penalty.")
    max_tokens: int = Field(256, gt=0, description="Default completion length when a request sets none.")
    mem_budget_mb: int | None = Field(
        None,
        gt=0,
        description="Native vision: the replica's memory budget, MB, checked at start against the peak of a "
        "worst-case batch (max_num_seqs requests, each with the model's image limit at the processor's largest "
        "size and text up to max_model_len): the peak RSS of the process on CPU, the CUDA allocator's peak on a "
        "GPU. Over it, the replica refuses to start. Default: none on CPU (measured and reported only); on a GPU "
        "the card's memory times the replica's GPU share.",
    )
    processor_cache_mb: float = Field(
        256.0,
        ge=0,
        description="Native vision: processed image tensors kept per replica, keyed by the image's SHA-256, "
        "bounded in MB (least recently used first out); 0 disables.",
    )
    batch_wait_ms: float = Field(
        10.0,
        ge=0,
        le=10_000,
        description="Native vision: how long an idle replica waits for more requests to fill a batch.",
    )
    stream_interval_ms: float = Field(
        0.0,
        ge=0,
        le=10_000,
        description="Coalesce streamed text: after a chunk, new text is held until this many ms have passed, "
        "then sent as one chunk (the first and the last are never held): fewer Serve messages per token. "
        "0 sends every piece.",
    )

    @model_validator(mode="after")
    def _int4_dtype(self) -> EngineParams:
        if self.quantization == "int4-cpu" and self.dtype not in {"auto", "bfloat16"}:
            raise ValueError(f"quantization int4-cpu computes in bfloat16; dtype {self.dtype} cannot be used with it")
        return self


class CaptioningConfig(_Strict):
    """A captioner's own settings (the ``captioning:`` section of its models.yaml entry): how its
    replica batches images and how it is prompted."""

    prompt_template: str = Field(
        "Describe this image in one or two sentences.",
        description="Caption prompt. May contain {user_text}: the text of the user's message.",
    )
    max_new_tokens: int = Field(64, gt=0, description="Longest caption, in tokens.")
    max_batch_size: int = Field(
        8, gt=0, description="Images captioned in one forward pass by a captioner replica; 1 turns batching off."
    )
    batch_wait_timeout_s: float = Field(
        0.05, ge=0, description="How long a captioner replica waits for more images to fill a batch."
    )

    @model_validator(mode="after")
    def _template_fields(self) -> CaptioningConfig:
        fields = {f for _, f, _, _ in string.Formatter().parse(self.prompt_template) if f is not None}
        if fields - {"user_text"}:
            raise ValueError(f"prompt_template may only use {{user_text}}, found {sorted(fields)}")
        return self

    def prompt(self, user_text: str) -> str:
        return self.prompt_template.format(user_text=user_text)


class ProxyVisionConfig(_Strict):
    """How the ingress uses the captioner (the file-level ``proxy_vision:`` section): deadlines, the
    failure policy, what a degraded answer says, and the caption cache.

    A degraded answer always says so to programs (the `vision` field, `system_fingerprint`, the
    `X-Vision-Degraded` header) and tells the decoder (`rewrite.unseen_marker`); `degraded_notice`
    is for people behind clients that show only the text, and for decoders too small to follow
    the prompt's instruction."""

    timeout_s: float = Field(60.0, gt=0, description="Deadline of one captioning call.")
    on_failure: Literal["degrade", "reject"] = Field(
        "degrade",
        description="When the captioner is down: degrade = answer, telling the decoder the image was not seen, "
        "with a `vision` field in the body and an X-Vision-Degraded header; reject = 503.",
    )
    degraded_notice: str | None = Field(
        None,
        min_length=1,
        description="Text put, as it is, before the answer of a degraded request: before the content of a "
        "completion, and as the first content delta of a stream. Not generated, so not counted in usage's "
        "completion_tokens. null: none (the answer is the decoder's alone).",
    )
    retry_after_s: float = Field(10.0, gt=0, description="After a captioner failure, how long image requests skip it.")
    cache_entries: int = Field(
        4096, ge=0, description="Captions kept per ingress replica, keyed by image hash and prompt; 0 disables."
    )
    cache_mb: float = Field(16.0, gt=0, description="Memory bound of the caption cache (captions and keys), MB.")


def _allow_entry(value: str) -> str:
    entry = value.strip().rstrip(".").lower()
    if not entry or "://" in entry or (("/" in entry or ":" in entry) and _network(entry) is None):
        raise ValueError(f"{value!r} is neither a host name nor an IP address or CIDR network")
    return entry


def _network(entry: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return None


class ImageInputConfig(_Strict):
    """Limits and sources of request images (``data:``, ``http(s)://``, ``file://`` URLs)."""

    max_image_bytes: int = Field(20 * 1024 * 1024, gt=0, description="Largest encoded image, in bytes.")
    max_image_pixels: int = Field(40_000_000, gt=0, description="Largest image, width x height (read from the header).")
    allow_remote: bool = Field(True, description="Accept http:// and https:// image URLs at all.")
    connect_timeout_s: float = Field(5.0, gt=0, description="Deadline of DNS lookup plus TCP/TLS connect, per hop.")
    read_timeout_s: float = Field(10.0, gt=0, description="Longest silence while waiting for response bytes.")
    total_timeout_s: float = Field(
        20.0, gt=0, description="Deadline of a whole fetch, redirects and body included (stops slow drips)."
    )
    max_redirects: int = Field(3, ge=0, description="Redirects followed per fetch; each hop is checked again.")
    allow_hosts: list[Annotated[str, AfterValidator(_allow_entry)]] = Field(
        default_factory=list,
        description="Host names or IP/CIDR networks exempt from the private-address guard, e.g. an internal "
        "image store, or 127.0.0.1/32 in tests. Host names match exactly (no wildcards).",
    )
    file_root: str | None = Field(
        None, description="file:// URLs are served only from inside this directory; None rejects file:// URLs."
    )
    max_images_per_request: int = Field(16, ge=0, description="Most image parts in one request (400 beyond).")
    max_images_per_message: int = Field(8, ge=0, description="Most image parts in one message (400 beyond).")


class ServerConfig(_Strict):
    """HTTP-level limits and access of the ingress (the ``server:`` section of models.yaml)."""

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


MOVED_VISION_PROXY = (
    "capabilities.vision_proxy was split by where each setting is used: name the captioner with "
    "capabilities.captioner: <entry name or hub id>; prompt_template, max_new_tokens, max_batch_size and "
    "batch_wait_timeout_s go in the captioner's own models.yaml entry, under captioning:; timeout_s, on_failure, "
    "retry_after_s, cache_entries and cache_mb go in the file-level proxy_vision: section"
)


class Capabilities(_Strict):
    vision_mode: VisionMode = Field("disabled", description="disabled | proxy | native.")
    captioner: str | None = Field(
        None, description="Proxy mode: the captioner, a models.yaml entry name or a Hugging Face model id."
    )
    image_token: str | None = Field(
        None, description="Native vision: the image placeholder token. Default: the processor's own (image_token)."
    )
    max_images_per_request: int | None = Field(
        None,
        ge=0,
        description="Native vision: most images in one request for this model (vLLM's limit_mm_per_prompt); "
        "400 beyond. Also the image count of the worst-case batch profiled at start. Default: the file-level "
        "images.max_images_per_request.",
    )

    @model_validator(mode="before")
    @classmethod
    def _moved_settings(cls, data: Any) -> Any:
        if isinstance(data, dict) and "vision_proxy" in data:
            raise ValueError(MOVED_VISION_PROXY)
        return data

    @model_validator(mode="after")
    def _proxy_needs_captioner(self) -> Capabilities:
        if self.vision_mode == "proxy" and self.captioner is None:
            raise ValueError("vision_mode proxy needs a captioner")
        return self


class AutoscalingConfig(_Strict):
    """Replica autoscaling of a model's deployment (``deployment.autoscaling``), on ongoing requests:
    Serve keeps each replica near `target_ongoing_requests` (running and waiting requests, averaged
    over `look_back_period_s`), between `min_replicas` and `max_replicas`. The builder maps it into
    Serve's ``autoscaling_config`` (deployments/options.py), filling the fields left unset with the
    default of the model's role, and checks the result there (min <= initial <= max once filled, a
    CPU decoder's replicas within the cores, the decoder never at zero)."""

    min_replicas: int = Field(
        1,
        ge=0,
        description="Fewest replicas. 0 (the captioner only): no replica while idle; the next image request "
        "starts one and waits for it at most proxy_vision.timeout_s, then degrades per proxy_vision.on_failure.",
    )
    max_replicas: int | None = Field(
        None,
        gt=0,
        description="Most replicas. Default: a GPU decoder 2; a CPU decoder decoder_cpu_replicas (auto: 2 on "
        "2+ cores), each with cores / max_replicas threads under cpu_threads: all, never more than the cores; "
        "a captioner 2 with a GPU share, 1 on CPU.",
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


class DeploymentConfig(_Strict):
    """Serve options of a model's deployment (the ``deployment:`` section of its entry). Unset ones
    take the builder's default for the model's role (deployments/options.py); serve_config.yaml may
    still override any of them."""

    max_ongoing_requests: int | None = Field(
        None,
        gt=0,
        description="Requests one replica takes at once. Decoder default: twice max_num_seqs (a full batch "
        "running, another waiting in the replica); the builder refuses less than max_num_seqs. Captioner: 16.",
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


class FakeToolCall(_Strict):
    """The tool call `engine: fake` answers with (``fake.tool_call``)."""

    name: str = Field(min_length=1, description="The function's name.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="Its arguments (a JSON object).")


class FakeEngineConfig(_Strict):
    """Settings of ``engine: fake``, the deterministic engine shipped for tests and demos."""

    token_delay_ms: float = Field(0.0, ge=0, description="Wait before each generated token: a slow decoder.")
    fill_to_max_tokens: bool = Field(
        False, description="After echoing the prompt, go on with ' tick' tokens up to max_tokens: a long generation."
    )
    tool_call: FakeToolCall | None = Field(
        None,
        description="When a request brings `tools`, answer with this call in the Hermes form "
        '(`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`) instead of the echo: tool-call parsing tests.',
    )


class ModelConfig(_Strict):
    """One entry of ``models:``."""

    name: str = Field(min_length=1, description="Name clients send as `model`.")
    hf_id: str | None = Field(None, description="Hugging Face model id.")
    local_path: str | None = Field(None, description="Local model directory (relative to models.yaml).")
    weight_file: str | None = Field(None, description="GGUF file inside hf_id or local_path.")
    engine: str = Field(
        "transformers",
        description="transformers; llama.cpp (a GGUF file, weight_file, on llama.cpp: decoders only); fake "
        "(deterministic: echoes the prompt, captions by pixel colour); or `module:Class` of your own "
        "TextEngine/CaptionEngine.",
    )
    params: EngineParams = Field(default_factory=EngineParams)
    capabilities: Capabilities = Field(default_factory=Capabilities)
    captioning: CaptioningConfig = Field(
        default_factory=CaptioningConfig, description="Settings used when this model is a captioner."
    )
    deployment: DeploymentConfig = Field(default_factory=DeploymentConfig, description="Serve options.")
    fake: FakeEngineConfig = Field(default_factory=FakeEngineConfig, description="Settings of engine: fake.")

    @field_validator("fake")
    @classmethod
    def _fake_needs_fake_engine(cls, fake: FakeEngineConfig, info: ValidationInfo) -> FakeEngineConfig:
        # Only a `fake:` section that was given is validated; the engine is validated before it.
        engine = info.data.get("engine")
        if engine is not None and engine != "fake":
            raise ValueError(
                f"this section applies only to engine: fake, and model {info.data.get('name')!r} has engine "
                f"{engine!r}: remove it or set engine: fake"
            )
        return fake

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if (self.hf_id is None) == (self.local_path is None) and self.engine in ("transformers", "llama.cpp"):
            raise ValueError("set exactly one of hf_id and local_path")
        return self

    @property
    def source(self) -> str:
        """What `from_pretrained` loads: the local directory or the hub id."""
        return self.local_path or self.hf_id or self.name


class Lifecycle(_Strict):
    """File-level model lifecycle settings, handed to every deployment that holds an engine."""

    idle_unload_secs: float | None = Field(
        None, gt=0, description="Unload a model after this many idle seconds; reload on next use."
    )
    load_retry_secs: float = Field(
        15.0, gt=0, description="First retry after a model failed to load; doubles up to 5 minutes."
    )


class ModelsFile(Lifecycle):
    models: list[ModelConfig] = Field(min_length=1)
    primaries: list[str] | None = Field(
        None,
        min_length=1,
        description="The models served behind the endpoint (clients' `model`), by entry name, each with its own "
        "decoder deployment; the first is the default (its /health components are the top-level ones). null: the "
        "first entry only. Builder arg `model` serves that entry alone.",
    )
    images: ImageInputConfig = Field(
        default_factory=ImageInputConfig, description="Limits and allowed sources of request images."
    )
    server: ServerConfig = Field(default_factory=ServerConfig, description="HTTP limits and API keys.")
    proxy_vision: ProxyVisionConfig = Field(
        default_factory=ProxyVisionConfig, description="How the ingress calls the captioner and caches captions."
    )

    @model_validator(mode="after")
    def _unique_names(self) -> ModelsFile:
        seen: set[str] = set()
        for m in self.models:
            if m.name in seen:
                raise ValueError(f"duplicate model name {m.name!r}")
            seen.add(m.name)
        for name in self.primaries or []:
            if name not in seen:
                raise ValueError(f"primaries: no entry named {name!r} (entries: {', '.join(sorted(seen))})")
        if self.primaries is not None and len(set(self.primaries)) != len(self.primaries):
            raise ValueError(f"primaries: a model is named twice in {self.primaries}")
        return self

    def get(self, name: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == name), None)


GpuShare = float | Literal["auto"]


class AppArgs(_Strict):
    """Arguments of `build_app` / `build_captioner_app` (serve_config.yaml `args:` or CLI key=value).

    Dotted CLI keys nest: ``decoder.max_tokens=64`` is ``{"decoder": {"max_tokens": 64}}``.
    """

    models_file: str = Field("models.yaml", description="Path of models.yaml.")
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
    captioner_app: str = Field("vision", description="Serve application that runs the captioner.")
    decoder_gpus: GpuShare = Field("auto", description="num_gpus per decoder replica; auto: 0.5 with GPUs.")
    captioner_gpus: GpuShare = Field("auto", description="num_gpus per captioner replica.")
    decoder_cpu_replicas: Annotated[int, Field(gt=0)] | Literal["auto"] = Field(
        "auto",
        description="Decoder replicas when the decoder runs on CPU; with cpu_threads: all they share the "
        "cores. auto: 2 on a machine with 2 or more cores, else 1. Under deployment.autoscaling, the default "
        "max_replicas.",
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

"""Typed mirror of ``models.yaml`` and of the application builder's arguments.

Everything is validated here, at build time, before any weight touches a device: unknown keys,
duplicate names, a proxy vision mode without a captioner, a missing local file. Errors are
`ConfigError`s whose message names the file and the field (``models.yaml: models[0].params.dtype:
...``). Builder args (``serve_config.yaml`` ``args:`` or ``serve run ... key=value``) override the
file's values and are validated by the same models.
"""

from __future__ import annotations

import ipaddress
import string
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from deployments.errors import ConfigError, validation_param


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
    temperature: float = Field(0.7, ge=0, le=2, description="Default sampling temperature; 0 = greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Default nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Default top-k; 0 disables it.")
    frequency_penalty: float = Field(0.0, ge=-2, le=2, description="Default OpenAI frequency penalty.")
    presence_penalty: float = Field(0.0, ge=-2, le=2, description="Default OpenAI presence penalty.")
    max_tokens: int = Field(256, gt=0, description="Default completion length when a request sets none.")
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


class VisionProxyConfig(_Strict):
    """How images are turned into text for a text-only primary model."""

    model: str = Field(description="Captioner: a models.yaml entry name or a Hugging Face model id.")
    prompt_template: str = Field(
        "Describe this image in one or two sentences.",
        description="Caption prompt. May contain {user_text}: the text of the user's message.",
    )
    max_new_tokens: int = Field(64, gt=0, description="Longest caption, in tokens.")
    timeout_s: float = Field(60.0, gt=0, description="Deadline of one captioning call.")
    on_failure: Literal["degrade", "reject"] = Field(
        "degrade",
        description="When the captioner is down: degrade = answer with a marker per image and an "
        "X-Vision-Degraded header; reject = 503.",
    )
    retry_after_s: float = Field(10.0, gt=0, description="After a captioner failure, how long image requests skip it.")
    max_batch_size: int = Field(
        8, gt=0, description="Images captioned in one forward pass by a captioner replica; 1 turns batching off."
    )
    batch_wait_timeout_s: float = Field(
        0.05, ge=0, description="How long a captioner replica waits for more images to fill a batch."
    )
    cache_entries: int = Field(
        4096, ge=0, description="Captions kept per ingress replica, keyed by image hash and prompt; 0 disables."
    )
    cache_mb: float = Field(16.0, gt=0, description="Memory bound of the caption cache (captions and keys), MB.")

    @model_validator(mode="after")
    def _template_fields(self) -> VisionProxyConfig:
        fields = {f for _, f, _, _ in string.Formatter().parse(self.prompt_template) if f is not None}
        if fields - {"user_text"}:
            raise ValueError(f"prompt_template may only use {{user_text}}, found {sorted(fields)}")
        return self

    def prompt(self, user_text: str) -> str:
        return self.prompt_template.format(user_text=user_text)


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


class Capabilities(_Strict):
    vision_mode: VisionMode = Field("disabled", description="disabled | proxy | native.")
    vision_proxy: VisionProxyConfig | None = Field(None, description="Captioner for proxy mode.")
    image_token: str | None = Field(None, description="Image placeholder token of a native VLM.")

    @model_validator(mode="after")
    def _proxy_needs_captioner(self) -> Capabilities:
        if self.vision_mode == "proxy" and self.vision_proxy is None:
            raise ValueError("vision_mode proxy needs a vision_proxy captioner")
        return self


class ModelConfig(_Strict):
    """One entry of ``models:``."""

    name: str = Field(min_length=1, description="Name clients send as `model`.")
    hf_id: str | None = Field(None, description="Hugging Face model id.")
    local_path: str | None = Field(None, description="Local model directory (relative to models.yaml).")
    weight_file: str | None = Field(None, description="GGUF file inside hf_id or local_path.")
    engine: str = Field(
        "transformers",
        description="transformers, or `module:Class` of a custom engine (tests use this for fakes).",
    )
    params: EngineParams = Field(default_factory=EngineParams)
    capabilities: Capabilities = Field(default_factory=Capabilities)

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if (self.hf_id is None) == (self.local_path is None) and self.engine == "transformers":
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
    images: ImageInputConfig = Field(
        default_factory=ImageInputConfig, description="Limits and allowed sources of request images."
    )
    server: ServerConfig = Field(default_factory=ServerConfig, description="HTTP limits and API keys.")

    @model_validator(mode="after")
    def _unique_names(self) -> ModelsFile:
        seen: set[str] = set()
        for m in self.models:
            if m.name in seen:
                raise ValueError(f"duplicate model name {m.name!r}")
            seen.add(m.name)
        return self

    def get(self, name: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == name), None)


GpuShare = float | Literal["auto"]


class AppArgs(_Strict):
    """Arguments of `build_app` / `build_captioner_app` (serve_config.yaml `args:` or CLI key=value).

    Dotted CLI keys nest: ``decoder.max_tokens=64`` is ``{"decoder": {"max_tokens": 64}}``.
    """

    models_file: str = Field("models.yaml", description="Path of models.yaml.")
    model: str | None = Field(None, description="Primary model entry. Default: the first entry.")
    vision_mode: VisionMode | None = Field(None, description="Overrides the primary's vision_mode.")
    on_image_failure: Literal["degrade", "reject"] | None = Field(
        None, description="Overrides vision_proxy.on_failure."
    )
    decoder: dict[str, Any] = Field(default_factory=dict, description="Overrides of the primary's params.")
    captioner: dict[str, Any] = Field(default_factory=dict, description="Overrides of the captioner's params.")
    captioner_app: str = Field("vision", description="Serve application that runs the captioner.")
    decoder_gpus: GpuShare = Field("auto", description="num_gpus per decoder replica; auto: 0.5 with GPUs.")
    captioner_gpus: GpuShare = Field("auto", description="num_gpus per captioner replica.")
    decoder_cpu_replicas: Annotated[int, Field(gt=0)] | Literal["auto"] = Field(
        "auto",
        description="Decoder replicas when the decoder runs on CPU; with cpu_threads: all they share the "
        "cores. auto: 2 on a machine with 2 or more cores, else 1.",
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


class ServicePlan(_Strict):
    """The resolved configuration the deployments are built from."""

    primary: ModelConfig
    captioner: ModelConfig | None
    lifecycle: Lifecycle
    captioner_app: str
    images: ImageInputConfig
    server: ServerConfig

    @property
    def vision(self) -> VisionProxyConfig | None:
        caps = self.primary.capabilities
        return caps.vision_proxy if caps.vision_mode == "proxy" else None


def _format_validation(where: str, exc: ValidationError) -> ConfigError:
    lines = []
    for err in exc.errors():
        param = validation_param(tuple(err["loc"]))
        lines.append(f"{where}: {param or '<root>'}: {err['msg']}")
    return ConfigError("\n".join(lines))


def load_models_file(path: str | Path) -> ModelsFile:
    """Read and validate models.yaml; local paths become absolute and must exist."""
    path = Path(path).resolve()
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_models(raw, path)


def parse_models(raw: Any, path: Path) -> ModelsFile:
    try:
        parsed = ModelsFile.model_validate(raw)
    except ValidationError as exc:
        raise _format_validation(str(path), exc) from None
    models = []
    for i, m in enumerate(parsed.models):
        if m.local_path is not None:
            local = (path.parent / m.local_path).resolve()
            if not local.exists():
                raise ConfigError(f"{path}: models[{i}].local_path: {local} does not exist")
            if m.weight_file and not (local / m.weight_file).is_file():
                raise ConfigError(f"{path}: models[{i}].weight_file: {local / m.weight_file} not found")
            m = m.model_copy(update={"local_path": str(local)})
        models.append(m)
    images = parsed.images
    if images.file_root is not None:
        root = (path.parent / images.file_root).resolve()
        if not root.is_dir():
            raise ConfigError(f"{path}: images.file_root: {root} is not a directory")
        images = images.model_copy(update={"file_root": str(root)})
    return parsed.model_copy(update={"models": models, "images": images})


def _with_params(model: ModelConfig, overrides: dict[str, Any], where: str) -> ModelConfig:
    if not overrides:
        return model
    try:
        params = EngineParams.model_validate({**model.params.model_dump(exclude_unset=True), **overrides})
    except ValidationError as exc:
        raise _format_validation(where, exc) from None
    return model.model_copy(update={"params": params})


def resolve_plan(args: dict[str, Any] | AppArgs) -> ServicePlan:
    """Validate builder args, load models.yaml, apply overrides, pick the primary and captioner."""
    try:
        app_args = args if isinstance(args, AppArgs) else AppArgs.model_validate(args or {})
    except ValidationError as exc:
        raise _format_validation("builder args", exc) from None
    models = load_models_file(app_args.models_file)
    where = str(Path(app_args.models_file).resolve())

    primary = models.get(app_args.model) if app_args.model else models.models[0]
    if primary is None:
        raise ConfigError(f"builder args: model: no entry named {app_args.model!r} in {where}")
    primary = _with_params(primary, app_args.decoder, "builder args: decoder")

    caps = primary.capabilities
    updates: dict[str, Any] = {}
    if app_args.vision_mode is not None:
        updates["vision_mode"] = app_args.vision_mode
    if app_args.on_image_failure is not None and caps.vision_proxy is not None:
        updates["vision_proxy"] = caps.vision_proxy.model_copy(update={"on_failure": app_args.on_image_failure})
    if updates:
        try:
            caps = Capabilities.model_validate({**caps.model_dump(), **updates})
        except ValidationError as exc:
            raise _format_validation("builder args", exc) from None
        primary = primary.model_copy(update={"capabilities": caps})
    if caps.vision_mode == "native":
        raise ConfigError(
            f"{where}: {primary.name}.capabilities.vision_mode: native vision is not available yet; "
            "use proxy (a captioner describes images for the text-only primary)"
        )

    captioner = None
    if caps.vision_mode == "proxy" and caps.vision_proxy is not None:
        ref = caps.vision_proxy.model
        captioner = models.get(ref) or ModelConfig(name=ref, hf_id=ref)
        captioner = _with_params(captioner, app_args.captioner, "builder args: captioner")

    return ServicePlan(
        primary=primary,
        captioner=captioner,
        lifecycle=Lifecycle.model_validate(models.model_dump(include=set(Lifecycle.model_fields))),
        captioner_app=app_args.captioner_app,
        images=models.images,
        server=models.server,
    )

"""models.yaml itself: an entry (`ModelConfig`, with `engine: fake`'s settings), the file-level
lifecycle settings and the whole file (`ModelsFile`).
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from deployments.config.documents import DocumentInputConfig
from deployments.config.embedding import EmbeddingConfig
from deployments.config.params import EngineParams
from deployments.config.serving import DeploymentConfig, ServerConfig
from deployments.config.strict import StrictModel
from deployments.config.vision import Capabilities, CaptioningConfig, ImageInputConfig, ProxyVisionConfig

AUTO = "auto"  # the engine picked by the replica's placement (engines/registry.py resolves it)
FAKE = "fake"  # the shipped deterministic engine, whose settings are the `fake:` section below


class FakeToolCall(StrictModel):
    """The tool call `engine: fake` answers with (``fake.tool_call``)."""

    name: str = Field(min_length=1, description="The function's name.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="Its arguments (a JSON object).")


class FakeEngineConfig(StrictModel):
    """Settings of ``engine: fake``, the deterministic engine shipped for tests and demos."""

    token_delay_ms: float = Field(0.0, ge=0, description="Wait before each generated token: a slow decoder.")
    fill_to_max_tokens: bool = Field(
        False, description="After echoing the prompt, go on with ' tick' tokens up to max_tokens: a long generation."
    )
    tool_call: FakeToolCall | None = Field(
        None,
        description="When a request brings `tools` and its chat holds no tool result yet, answer with this call "
        "instead of the echo, written in the entry's capabilities.tool_call_format (auto: Hermes, "
        '`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`): tool-call parsing tests and agent tool loops.',
    )


class ModelConfig(StrictModel):
    """One entry of ``models:``."""

    name: str = Field(min_length=1, description="Name clients send as `model`.")
    hf_id: str | None = Field(None, description="Hugging Face model id.")
    local_path: str | None = Field(None, description="Local model directory (relative to models.yaml).")
    weight_file: str | None = Field(None, description="GGUF file inside hf_id or local_path.")
    mmproj_file: str | None = Field(
        None,
        description="A GGUF vision-language model's multimodal projector (the `mmproj` file llama.cpp's --mmproj "
        "takes: the vision encoder and its projection), beside weight_file: inside local_path (or its directory "
        "when local_path is the GGUF file) or the hub repo hf_id. Needed by engine llama.cpp for vision_mode "
        "native and as a captioner (docs/vision.md).",
    )
    chat_template: str | None = Field(
        None,
        description="A chat template file (Jinja, relative to models.yaml) used instead of the model's own, "
        "as vLLM's --chat-template: e.g. one that renders tools. Checked when the service is built: the file "
        "must exist and be a valid Jinja template.",
    )
    engine: str = Field(
        AUTO,
        description="auto: llama.cpp for a model whose weight_file is a .gguf and that runs on CPU (no GPU "
        "share: deployment.num_gpus, or builder arg decoder_gpus for a decoder and captioner_gpus for a "
        "captioner, 0, or auto on a cluster without GPUs); transformers for everything else (Hugging Face "
        "models, GPU replicas). The builder resolves it from the placement and logs the engine it picked. "
        "transformers; llama.cpp (a GGUF file, weight_file, on llama.cpp's CPU kernels: a text decoder, or with "
        "mmproj_file a native vision primary or a captioner); fake (deterministic: echoes the prompt, captions by "
        "pixel colour); or `module:Class` of your own TextEngine/CaptionEngine.",
    )
    params: EngineParams = Field(default_factory=EngineParams, description="Engine settings.")
    capabilities: Capabilities = Field(
        default_factory=Capabilities,
        description="What the model can do as a primary: its vision mode and its tool-call format.",
    )
    captioning: CaptioningConfig = Field(
        default_factory=CaptioningConfig, description="Settings used when this model is a captioner."
    )
    embedding: EmbeddingConfig | None = Field(
        None,
        description="Makes this entry an embedding model, served at /v1/embeddings by its own deployment (listed "
        "in /v1/models, never a chat primary): how it pools, normalises, cuts and batches (docs/embeddings.md).",
    )
    deployment: DeploymentConfig = Field(default_factory=DeploymentConfig, description="Serve options.")
    fake: FakeEngineConfig = Field(default_factory=FakeEngineConfig, description="Settings of engine: fake.")

    @field_validator("fake")
    @classmethod
    def _fake_needs_fake_engine(cls, fake: FakeEngineConfig, info: ValidationInfo) -> FakeEngineConfig:
        # Only a `fake:` section that was given is validated; the engine is validated before it.
        engine = info.data.get("engine")
        if engine is not None and engine != FAKE:
            raise ValueError(
                f"this section applies only to engine: fake, and model {info.data.get('name')!r} has engine "
                f"{engine!r}: remove it or set engine: fake"
            )
        return fake

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        """Every engine that loads weights (all but the fake one and your own `module:Class`) needs them."""
        loads = self.engine != FAKE and ":" not in self.engine
        if (self.hf_id is None) == (self.local_path is None) and loads:
            raise ValueError("set exactly one of hf_id and local_path")
        return self

    @property
    def source(self) -> str:
        """What `from_pretrained` loads: the local directory or the hub id."""
        return self.local_path or self.hf_id or self.name


class Lifecycle(StrictModel):
    """File-level model lifecycle settings, handed to every deployment that holds an engine."""

    idle_unload_s: float | None = Field(
        None, gt=0, description="Unload a model after this many idle seconds; reload on next use."
    )
    load_retry_s: float = Field(
        15.0, gt=0, description="First retry after a model failed to load; doubles up to 5 minutes."
    )


class ModelsFile(Lifecycle):
    """models.yaml: the model entries, which of them are served, and the service-wide input, server and vision
    settings.
    """

    models: list[ModelConfig] = Field(
        min_length=1, description="The model entries; primaries and captioners refer to them by name."
    )
    primaries: list[str] | None = Field(
        None,
        min_length=1,
        description="The models served behind the endpoint (clients' `model`), by entry name, each with its own "
        "decoder deployment; the first is the default (its /health components are the top-level ones). null: the "
        "first chat entry only (the first without an `embedding:` section). Builder arg `model` serves that entry "
        "alone. Every embedding entry is served besides, at /v1/embeddings.",
    )
    images: ImageInputConfig = Field(
        default_factory=ImageInputConfig, description="Limits and allowed sources of request images."
    )
    documents: DocumentInputConfig = Field(
        default_factory=DocumentInputConfig,
        description="Limits of request documents (PDF and text) and of the worker processes that read them.",
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
        for name in self.primaries or []:
            if self.get(name).embedding is not None:  # type: ignore[union-attr]
                raise ValueError(f"primaries: {name!r} is an embedding model (it has an `embedding:` section)")
        if not self.chat_models:
            raise ValueError("models: every entry is an embedding model; at least one chat model is needed")
        return self

    @property
    def chat_models(self) -> list[ModelConfig]:
        """The entries that can be chat primaries (without an `embedding:` section)."""
        return [m for m in self.models if m.embedding is None]

    @property
    def embedders(self) -> list[ModelConfig]:
        """The embedding models (entries with an `embedding:` section), served at /v1/embeddings."""
        return [m for m in self.models if m.embedding is not None]

    def get(self, name: str) -> ModelConfig | None:
        return next((m for m in self.models if m.name == name), None)

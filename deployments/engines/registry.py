"""What the rest of the service knows about each engine, in one place: an `EngineSpec` per engine
that models.yaml names (`ENGINES`), and `engine_spec`, which also answers for ``module:Class``.

A spec owns the engine's settings: which of ``params:`` it reads beyond those every engine reads
(`settings`; an entry that sets another is refused, `check_settings`), how a decoder running it is placed on
CPU (how many replicas share the cores, and whether an unset `cpu_threads` means every core), what
its replicas' processes need in their environment, and how it builds its text and caption engines.
The builder (`deployments/options/`) and `factory` ask the spec; neither compares engine names.

The constructors import their engine's package only when called, so that choosing one engine
never imports another's library (llama.cpp never imports torch, transformers never imports
xllamacpp). ``auto`` is no engine: the builder resolves it from the replica's placement
(`registry.resolved`) before it asks.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from deployments.config import AUTO, EVERY_ENGINE, EngineParams, ModelConfig
from deployments.engines.base import CaptionEngine, EmbedEngine, TextEngine
from deployments.engines.fake import FakeCaptionEngine, FakeTextEngine
from deployments.errors import ConfigError

E = TypeVar("E", TextEngine, CaptionEngine)

TRANSFORMERS, LLAMA_CPP = "transformers", "llama.cpp"  # what models.yaml's `engine:` names them

logger = logging.getLogger("ray.serve")

CPU_DECODERS = 2  # decoder replicas on a CPU-only machine with 2+ cores (decoder_cpu_replicas: auto), by default

# Variables a torch replica's process must have when it starts (read by libgomp and oneDNN at import).
# OpenMP threads spin briefly, then sleep, so that Serve's proxy and ingress still get a core (the default
# spin made a 2-core machine 4x slower); bounded oneDNN kernel caches: continuous batching gives most
# steps a new matmul shape, and at the default 1024 entries per cache a decoder grew ~0.5 MB a request,
# to hundreds of MB (docs/reliability.md); 16 keeps it flat.
TORCH_ENV = {"GOMP_SPINCOUNT": "20000", "LRU_CACHE_CAPACITY": "16", "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "16"}
# llama.cpp's CPU kernels run on libgomp too (the xllamacpp wheel links it): the same brief spin.
OPENMP_ENV = {"GOMP_SPINCOUNT": TORCH_ENV["GOMP_SPINCOUNT"]}


@dataclass(frozen=True)
class EngineSpec:
    """One engine as the builder and the replicas see it."""

    name: str
    """The name models.yaml gives it (`ModelConfig.engine`)."""
    text_engine: Callable[[ModelConfig], TextEngine]
    """Builds the decoder engine for a model entry (imports the engine's library only when called)."""
    caption_engine: Callable[[ModelConfig], CaptionEngine]
    """Builds the captioner engine for a model entry."""
    settings: frozenset[str] | None = frozenset()
    """The fields of ``params:`` (`EngineParams`) it reads beyond `EVERY_ENGINE`'s; an entry that sets
    another is refused (`check_settings`). None: it reads what it likes (your own engine)."""
    cpu_replicas: int = CPU_DECODERS
    """Decoder replicas on CPU under `decoder_cpu_replicas: auto` (before the cores cap them)."""
    threads_are_cores: bool = False
    """Whether an unset `cpu_threads` means the replica's share of the cores (as ``all``), rather
    than Ray's num_cpus."""
    replica_env: Mapping[str, str] = field(default_factory=dict)
    """Variables its replicas' processes need when they start."""
    embed_engine: Callable[[ModelConfig], EmbedEngine] | None = None
    """Builds the embedding engine for an entry with an `embedding:` section; None: the engine
    embeds nothing (a ConfigError when such an entry names it)."""


def _transformers_text(model: ModelConfig) -> TextEngine:
    """Under `vision_mode: native` the VLM engine; else `params.batching`'s engine: `auto` is the
    static-slot decoder on one CUDA GPU for a model of its shapes, or with LoRA adapters (`params.lora`),
    continuous batching otherwise (on a CPU always).
    """
    lora = model.params.lora is not None
    if model.capabilities.vision_mode == "native":
        if lora:
            raise ConfigError(f"model {model.name!r}: LoRA adapters are not served with vision_mode: native yet")
        from deployments.engines.transformers.native import NativeVisionEngine

        return NativeVisionEngine(model)
    batching = model.params.batching
    if batching == "continuous" and lora:
        raise ConfigError(
            f"model {model.name!r}: LoRA adapters need batching: static (rows of several adapters in one step) or "
            "sequential; transformers' continuous batching packs every request into one row"
        )
    if batching == "auto" and lora:
        batching = "static"
    if batching == "auto":
        from deployments.engines.transformers.static.engine import cuda_default

        batching = "static" if cuda_default(model) else "continuous"
    if batching == "sequential":
        from deployments.engines.transformers.sequential import SequentialTextEngine

        return SequentialTextEngine(model)
    if batching == "static":
        from deployments.engines.transformers.static.engine import StaticTextEngine

        return StaticTextEngine(model)
    from deployments.engines.transformers.continuous import ContinuousBatchingTextEngine

    return ContinuousBatchingTextEngine(model)


def _transformers_caption(model: ModelConfig) -> CaptionEngine:
    from deployments.engines.transformers.captioner import TransformersCaptionEngine

    return TransformersCaptionEngine(model)


def _transformers_embed(model: ModelConfig) -> EmbedEngine:
    from deployments.engines.transformers.embedder import TransformersEmbedEngine

    return TransformersEmbedEngine(model)


def _llama_cpp_text(model: ModelConfig) -> TextEngine:
    """A text decoder, or under `vision_mode: native` the GGUF VLM with its projector."""
    from deployments.engines.llamacpp import LlamaCppTextEngine, LlamaCppVisionEngine

    native = model.capabilities.vision_mode == "native"
    return LlamaCppVisionEngine(model) if native else LlamaCppTextEngine(model)


def _llama_cpp_embed(model: ModelConfig) -> EmbedEngine:
    from deployments.engines.llamacpp.embedder import LlamaCppEmbedEngine

    return LlamaCppEmbedEngine(model)


def _llama_cpp_caption(model: ModelConfig) -> CaptionEngine:
    from deployments.engines.llamacpp import LlamaCppCaptionEngine

    return LlamaCppCaptionEngine(model)


ENGINES: dict[str, EngineSpec] = {
    spec.name: spec
    for spec in (
        # Hugging Face models (and a GGUF text model when named), on CPU or GPUs. On CPU its step loop
        # runs in Python, which no OpenMP barrier spans: CPU_DECODERS processes with a share of the
        # cores each (1.4x one replica with both cores, docs/benchmarks.md).
        EngineSpec(
            TRANSFORMERS,
            _transformers_text,
            _transformers_caption,
            settings=frozenset(
                {
                    "dtype",
                    "quantization",
                    "device_ids",
                    "batching",
                    "cuda_graphs",
                    "compile_level",
                    "graph_q_padding",
                    "graph_kv_padding",
                    "mem_budget_mb",
                    "processor_cache_mb",
                    "batch_wait_ms",
                    "enable_prefix_caching",
                    "lora",
                }
            ),
            replica_env=TORCH_ENV,
            embed_engine=_transformers_embed,
        ),
        # A GGUF file on llama.cpp's CPU kernels: it batches its slots in one process on OpenMP
        # threads over all the cores it is given, so one replica, its threads its cores. It runs the
        # GGUF file as it is: the transformers engines' loading and batching settings mean nothing.
        EngineSpec(
            LLAMA_CPP,
            _llama_cpp_text,
            _llama_cpp_caption,
            settings=frozenset(
                {
                    "kv_cache_dtype",
                    "batch_invariant",
                    "enable_prefix_caching",
                    "cache_ram_mib",
                    "lora",
                    "cpu_threads_batch",
                }
            ),
            cpu_replicas=1,
            threads_are_cores=True,
            replica_env=OPENMP_ENV,
            embed_engine=_llama_cpp_embed,
        ),
        # Deterministic, shipped for tests and demos (its own settings: the entry's `fake:` section;
        # it takes any of ``params:``, so that a test sets what it needs); computes nothing, so its
        # processes need nothing.
        EngineSpec("fake", FakeTextEngine, FakeCaptionEngine, settings=frozenset(EngineParams.model_fields)),
    )
}


def _custom_engine(model: ModelConfig, base: type[E]) -> Callable[[ModelConfig], E]:
    """The class named `module:Class` by `model.engine`, checked to implement `base`."""
    module_name, _, class_name = model.engine.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(f"model {model.name!r}: engine {model.engine!r} cannot be imported: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ConfigError(f"model {model.name!r}: engine {model.engine!r} is not a {base.__name__}")
    return cls


def engine_spec(name: str) -> EngineSpec:
    """The spec of the engine models.yaml names `name`: one of `ENGINES`, else ``module:Class`` of
    your own engine, placed as the torch engines are (its class imported when an engine is built,
    and checked to be a `TextEngine` or a `CaptionEngine`). ``auto`` must be resolved first.
    """
    if name in ENGINES:
        return ENGINES[name]
    if name == "auto":
        raise ValueError("engine auto has no spec: resolve it from the placement first (registry.resolved)")
    return EngineSpec(
        name,
        lambda model: _custom_engine(model, TextEngine)(model),  # type: ignore[type-abstract]
        lambda model: _custom_engine(model, CaptionEngine)(model),  # type: ignore[type-abstract]
        settings=None,
    )


AUTO_CHOICES = (TRANSFORMERS, LLAMA_CPP)
"""The engines that ``engine: auto`` resolves to, by the replica's placement (`resolved`)."""


def resolved(model: ModelConfig, *, on_cpu: bool) -> ModelConfig:
    """The entry with ``engine: auto`` resolved (any other engine is kept): llama.cpp when it runs on
    CPU (`on_cpu`: its replica has no GPU share) and its weight_file is a .gguf, as a decoder (text, or
    vision_mode native with its mmproj_file) or a captioner; else transformers (which loads GGUF
    text models only, and the PyPI llama.cpp wheel computes on the CPU only).
    """
    if model.engine != AUTO:
        return model
    gguf = (model.weight_file or "").lower().endswith(".gguf")
    return model.model_copy(update={"engine": LLAMA_CPP if on_cpu and gguf else TRANSFORMERS})


def check_settings(entry: ModelConfig, engine: str) -> None:
    """`ConfigError` when `entry` sets a setting of ``params:`` that its engine does not read, naming
    the engine, the setting and the engines that read it. `engine`: the one it runs on (``auto``
    resolved); an entry on ``auto`` may set what either engine that auto picks reads, and what the
    one it got does not read is logged as set aside.
    """
    spec = engine_spec(engine)
    if spec.settings is None:
        return
    given = entry.params.model_fields_set - EVERY_ENGINE
    if entry.engine == AUTO:
        allowed = frozenset().union(*(ENGINES[name].settings or () for name in AUTO_CHOICES))
        if aside := sorted(given & allowed - spec.settings):
            logger.info("model %s: engine auto runs on %s here, which sets aside %s", entry.name, spec.name, aside)
    else:
        allowed = spec.settings
    if unread := sorted(given - allowed):
        said = "; ".join(f"params.{name} (read by: {', '.join(_readers(name)) or 'no engine'})" for name in unread)
        raise ConfigError(f"engine {entry.engine} does not read {said}: remove it, or choose an engine that reads it")


def _readers(setting: str) -> list[str]:
    return [spec.name for spec in ENGINES.values() if spec.name != "fake" and setting in (spec.settings or ())]


def engine_replica_env() -> dict[str, str]:
    """The variables of a replica that holds an engine: those of every engine, whichever it runs, so
    that every decoder and captioner process starts with the same environment (as before the
    registry; the variables one engine needs change nothing for another).
    """
    env: dict[str, str] = {}
    for spec in ENGINES.values():
        env.update(spec.replica_env)
    return env

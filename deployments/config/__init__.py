"""Configuration: the typed mirror of models.yaml and of the builders' arguments, a module per
section (`models`: the file and its entries; `params`: an engine's settings; `vision`: capabilities,
captioning, proxy vision and image input; `documents`: document input; `chat`: the tool-call formats
and the check of a chat template file; `state`: the storage root and the bounds of stored state;
`serving`: server, deployment, autoscaling and the builder's arguments; `strict`: their base),
`loading` (reading the file and resolving the arguments into a `ServicePlan`), `machine` (cores)
and `gguf` (a GGUF file's header, which the LoRA checks and the llama.cpp engine read).

Every section forbids unknown keys and every field has a default and a description. The checks of
one field, section or entry are in its section (types and bounds; exactly one of hf_id and
local_path; int4-cpu with a bfloat16 dtype; prompt_template fields; a captioner for proxy vision;
`fake:` only with `engine: fake`), and so are duplicate model names (`ModelsFile`). What needs the
file on disk, the builder args or other entries (paths exist, the primary named by `model`,
`captioning:` only on a captioner's entry) is checked in `loading`; a decoder's
`max_ongoing_requests` against its `max_num_seqs`, and `deployment.autoscaling` once the role's
defaults fill it, in `deployments/options/`.
"""

from deployments.config.batches import BatchesConfig
from deployments.config.chat import TOOL_CALL_FORMATS, ToolCallFormat
from deployments.config.documents import DocumentInputConfig
from deployments.config.embedding import EmbeddingConfig, Pooling, TokenIdVocabulary
from deployments.config.loading import ServicePlan, load_models_file, parse_args, parse_models, resolve_plan
from deployments.config.lora import LoraConfig
from deployments.config.machine import cpu_cores
from deployments.config.models import (
    AUTO,
    FakeEngineConfig,
    Lifecycle,
    ModelConfig,
    ModelsFile,
)
from deployments.config.params import EVERY_ENGINE, EngineParams
from deployments.config.routing import RoutingConfig
from deployments.config.serving import AppArgs, AutoscalingConfig, DeploymentConfig, GpuShare, ServerConfig
from deployments.config.state import StateConfig
from deployments.config.vision import Capabilities, CaptioningConfig, ImageInputConfig, ProxyVisionConfig, VisionMode

__all__ = [
    "AUTO",
    "EVERY_ENGINE",
    "TOOL_CALL_FORMATS",
    "AppArgs",
    "AutoscalingConfig",
    "BatchesConfig",
    "Capabilities",
    "CaptioningConfig",
    "DeploymentConfig",
    "DocumentInputConfig",
    "EmbeddingConfig",
    "EngineParams",
    "FakeEngineConfig",
    "GpuShare",
    "ImageInputConfig",
    "Lifecycle",
    "LoraConfig",
    "ModelConfig",
    "ModelsFile",
    "Pooling",
    "ProxyVisionConfig",
    "RoutingConfig",
    "ServerConfig",
    "ServicePlan",
    "StateConfig",
    "TokenIdVocabulary",
    "ToolCallFormat",
    "VisionMode",
    "cpu_cores",
    "load_models_file",
    "parse_args",
    "parse_models",
    "resolve_plan",
]

"""Configuration: the typed mirror of models.yaml and of the builders' arguments, and its loading."""

from deployments.config.schema import (
    AppArgs,
    Capabilities,
    EngineParams,
    GpuShare,
    ImageInputConfig,
    Lifecycle,
    ModelConfig,
    ModelsFile,
    ServerConfig,
    ServicePlan,
    VisionMode,
    VisionProxyConfig,
    load_models_file,
    parse_models,
    resolve_plan,
)

__all__ = [
    "AppArgs",
    "Capabilities",
    "EngineParams",
    "GpuShare",
    "ImageInputConfig",
    "Lifecycle",
    "ModelConfig",
    "ModelsFile",
    "ServerConfig",
    "ServicePlan",
    "VisionMode",
    "VisionProxyConfig",
    "load_models_file",
    "parse_models",
    "resolve_plan",
]

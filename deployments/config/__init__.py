"""Configuration: `schema` (the typed mirror of models.yaml and of the builders' arguments),
`loading` (reading the file and resolving the arguments into a `ServicePlan`), `machine` (cores)."""

from deployments.config.loading import ServicePlan, load_models_file, parse_args, parse_models, resolve_plan
from deployments.config.machine import cpu_cores
from deployments.config.schema import (
    AppArgs,
    AutoscalingConfig,
    Capabilities,
    CaptioningConfig,
    DeploymentConfig,
    EngineParams,
    FakeEngineConfig,
    GpuShare,
    ImageInputConfig,
    Lifecycle,
    ModelConfig,
    ModelsFile,
    ProxyVisionConfig,
    ServerConfig,
    VisionMode,
)

__all__ = [
    "AppArgs",
    "AutoscalingConfig",
    "Capabilities",
    "CaptioningConfig",
    "DeploymentConfig",
    "EngineParams",
    "FakeEngineConfig",
    "GpuShare",
    "ImageInputConfig",
    "Lifecycle",
    "ModelConfig",
    "ModelsFile",
    "ProxyVisionConfig",
    "ServerConfig",
    "ServicePlan",
    "VisionMode",
    "cpu_cores",
    "load_models_file",
    "parse_args",
    "parse_models",
    "resolve_plan",
]

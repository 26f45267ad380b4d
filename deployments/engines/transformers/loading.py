"""Shared transformers loading: where the weights come from, which device, which dtype."""

from __future__ import annotations

import logging
import os
import socket
from typing import Any
from urllib.parse import urlparse

import torch

from deployments.config import EngineParams, ModelConfig, cpu_cores
from deployments.engines.transformers import int4_cpu
from deployments.engines.transformers.progress import LoadProgress
from deployments.errors import ConfigError

logger = logging.getLogger("ray.serve")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def pick_device(params: EngineParams) -> tuple[str, dict[str, Any]]:
    """`(device, from_pretrained kwargs)`: the GPU(s) Ray assigned, else the CPU.

    Ray sets CUDA_VISIBLE_DEVICES for a replica with `num_gpus`, so index 0 is the first GPU it
    was given; `device_ids` index into that list.
    """
    if not torch.cuda.is_available():
        if params.device_ids:
            logger.warning("device_ids %s ignored: no GPU visible to this replica", params.device_ids)
        return "cpu", {}
    ids = params.device_ids or list(range(torch.cuda.device_count()))
    if max(ids) >= torch.cuda.device_count():
        raise ConfigError(f"device_ids {ids}: only {torch.cuda.device_count()} GPU(s) visible to this replica")
    if len(ids) == 1:
        return f"cuda:{ids[0]}", {}
    return f"cuda:{ids[0]}", {"device_map": "auto", "max_memory": {i: torch.cuda.mem_get_info(i)[0] for i in ids}}


def pick_dtype(params: EngineParams, device: str) -> torch.dtype:
    """The dtype weights are loaded in. int4-cpu on a CPU loads float32 (a GGUF file is dequantized
    exactly), and `quantize_loaded` packs the linear layers and moves the rest to bfloat16.
    """
    if params.quantization == "int4-cpu" and device == "cpu":
        return torch.float32
    if params.dtype != "auto":
        return _DTYPES[params.dtype]
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """One quick connect to the hub (per load attempt, so a returning network is noticed);
    offline machines then load from the cache at once instead of retrying every file.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes"}:
        return False
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def pretrained_kwargs(model: ModelConfig) -> dict[str, Any]:
    """Keyword arguments shared by tokenizer/processor and model `from_pretrained` calls."""
    kwargs: dict[str, Any] = {}
    if model.weight_file:
        kwargs["gguf_file"] = model.weight_file
    if model.local_path is None and not hub_reachable():
        kwargs["local_files_only"] = True
    return kwargs


def quantization_kwargs(params: EngineParams, device: str) -> dict[str, Any]:
    """`from_pretrained` arguments for `params.quantization` on `device` (ConfigError where it cannot run)."""
    if params.quantization == "none":
        return {}
    if params.quantization == "int4-cpu":  # applied after loading, by `quantize_loaded`
        if device == "cpu" and not int4_cpu.available():
            raise ConfigError(
                f"quantization int4-cpu needs torch's CPU int4 kernel (torch {torch.__version__} lacks it)"
            )
        return {}
    if not device.startswith("cuda"):
        raise ConfigError(f"quantization {params.quantization} needs a CUDA GPU")
    from transformers import BitsAndBytesConfig

    if params.quantization == "bnb-4bit":
        return {"quantization_config": BitsAndBytesConfig(load_in_4bit=True)}
    return {"quantization_config": BitsAndBytesConfig(load_in_8bit=True)}


def load_kwargs(model: ModelConfig) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """`(device, shared, model_kwargs)`: `shared` is for the tokenizer/processor `from_pretrained`,
    `model_kwargs` (shared + placement, quantization, `dtype`) for the model's.
    """
    device, placement = pick_device(model.params)
    shared = pretrained_kwargs(model)
    kwargs = {**shared, **placement, **quantization_kwargs(model.params, device)}
    kwargs["dtype"] = pick_dtype(model.params, device)
    return device, shared, kwargs


def place(module: Any, device: str, kwargs: dict[str, Any]) -> Any:
    """Move to `device` unless accelerate already placed or quantized it."""
    if "device_map" in kwargs or "quantization_config" in kwargs:
        return module
    return module.to(device)


def quantize_loaded(module: Any, params: EngineParams, device: str, progress: LoadProgress | None = None) -> int:
    """Post-load quantization (`int4-cpu`, CPU replicas only); returns how many layers it replaced.
    With `progress`, it is the load's logged `quantize` step.
    """
    if params.quantization != "int4-cpu":
        return 0
    if device != "cpu":  # one models.yaml serves CPU and GPU machines (`decoder_gpus: auto`)
        logger.warning("int4-cpu applies to CPU replicas; on %s the weights stay %s", device, module.dtype)
        return 0
    if progress is None:
        return int4_cpu.quantize(module)
    return progress.quantize(module, "int4-cpu", lambda: int4_cpu.quantize(module))


def set_cpu_threads(params: EngineParams, device: str) -> int | None:
    """Apply `cpu_threads` (all: the cores this process may run on) to torch; returns torch's thread
    count on CPU (Ray's num_cpus when `cpu_threads` is null), None on GPU.
    """
    if device != "cpu":
        return None
    if params.cpu_threads is not None:
        torch.set_num_threads(cpu_cores() if params.cpu_threads == "all" else params.cpu_threads)
    return torch.get_num_threads()

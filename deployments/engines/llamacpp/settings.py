"""What a models.yaml entry's settings become for llama.cpp when its engine starts: the threads of its
one-token and batched steps, and its GGUF LoRA adapters' ids (refusing what llama.cpp cannot serve).
"""

from __future__ import annotations

import os

from deployments.config import EngineParams, ModelConfig, cpu_cores
from deployments.errors import ConfigError


def llama_threads(params: EngineParams) -> tuple[int, int]:
    """Threads of llama.cpp's one-token steps and of its batched steps (llama-server's -t and -tb):
    `cpu_threads` (all: the cores this process may run on), else OMP_NUM_THREADS (Ray sets it to the
    replica's num_cpus), else the cores; batched steps `cpu_threads_batch`, else as one-token steps.
    """

    def threads(setting: int | str | None) -> int:
        if setting == "all":
            return cpu_cores()
        if isinstance(setting, int):
            return setting
        omp = os.environ.get("OMP_NUM_THREADS", "")
        return int(omp) if omp.isdigit() and int(omp) > 0 else cpu_cores()

    single = threads(params.cpu_threads)
    return single, single if params.cpu_threads_batch is None else threads(params.cpu_threads_batch)


def lora_ids(model: ModelConfig) -> dict[str, int]:
    """The entry's GGUF LoRA adapters, by name, with their index in llama.cpp's list; refuses what
    llama.cpp cannot serve (adapters loaded at start only: no dynamic_path; GGUF files only).
    """
    lora = model.params.lora
    if lora is None:
        return {}
    if lora.dynamic_path is not None:
        raise ConfigError(
            f"model {model.name!r}: llama.cpp loads its LoRA adapters at start: lora.dynamic_path is not served"
        )
    if model.capabilities.vision_mode == "native":
        raise ConfigError(f"model {model.name!r}: LoRA adapters are not served with vision_mode: native yet")
    for name, path in lora.adapters.items():
        if not path.lower().endswith(".gguf"):
            raise ConfigError(
                f"model {model.name!r}: lora.adapters.{name}: llama.cpp takes a GGUF adapter file, not {path}"
            )
    return {name: i for i, name in enumerate(lora.adapters)}

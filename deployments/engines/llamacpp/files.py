"""Where the llama.cpp engine's files are: the GGUF model (`weight_file`) and a vision model's
projector (`mmproj_file`), each in `local_path` or fetched from the hub repo `hf_id`, the fetch
logged as a step of the load.
"""

from __future__ import annotations

import time
from pathlib import Path

from deployments.config import ModelConfig
from deployments.engines.load_log import HubCache, LoadLog, file_size, size_text
from deployments.errors import ConfigError


def gguf_path(model: ModelConfig, progress: LoadLog | None = None) -> Path:
    """The GGUF file: `weight_file` inside `local_path` (or `local_path` itself when it is the
    file), or `weight_file` of the hub repo `hf_id` (through the hub cache). With `progress`, the
    load's download step is logged (0 s for a local file).
    """
    if model.local_path is not None:
        base = Path(model.local_path)
        return model_file(model, base / model.weight_file if model.weight_file else base, "download", progress)
    if model.hf_id is not None and model.weight_file:
        return model_file(model, model.weight_file, "download", progress)
    raise ConfigError(f"model {model.name!r}: engine llama.cpp needs a GGUF file: set weight_file")


def model_file(model: ModelConfig, file: Path | str, step: str, progress: LoadLog | None = None) -> Path:
    """A file of the model: a local `Path` as it is, or a file name of the hub repo `hf_id`, fetched
    through the hub cache; `ConfigError` when it is not a file. With `progress`, the fetch is the
    load's `step` (0 s for a local file).
    """
    started = time.monotonic()
    if isinstance(file, Path):
        path, note = file, f"local, {size_text(file_size(file))} on disk"
    else:
        from huggingface_hub import hf_hub_download

        assert model.hf_id is not None
        cache = HubCache(model.hf_id)
        before = cache.blobs()
        path = Path(hf_hub_download(model.hf_id, file))
        fetched = cache.blobs().keys() - before.keys()
        note = f"fetched {size_text(cache.blob_bytes(fetched))} from the hub" if fetched else "cached in the hub cache"
    if not path.is_file():
        raise ConfigError(f"model {model.name!r}: engine llama.cpp needs a GGUF file, and {path} is not a file")
    if progress is not None:
        progress.step(step, time.monotonic() - started, note)
    return path


def mmproj_path(model: ModelConfig, progress: LoadLog | None = None) -> Path:
    """The projector file: `mmproj_file` beside the GGUF (inside `local_path`, or its directory when
    `local_path` is the GGUF file), or in the hub repo `hf_id`.
    """
    if not model.mmproj_file:
        raise ConfigError(
            f"model {model.name!r}: engine llama.cpp runs a vision model from its projector file: set mmproj_file "
            "(the mmproj GGUF published beside the model's)"
        )
    if model.local_path is None:
        return model_file(model, model.mmproj_file, "download-mmproj", progress)
    base = Path(model.local_path)
    return model_file(model, (base.parent if base.is_file() else base) / model.mmproj_file, "download-mmproj", progress)

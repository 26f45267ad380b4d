"""LoRA adapters of a primary (``params.lora``): where they are, how many a replica holds, and the
checks made on an adapter's folder (when the service is built for a listed one, when a replica
loads any). A storage URI (``s3://``, ``gs://``, ``hdfs://``, ``file://``) is read through `pyarrow.fs`
(the ``lora-storage`` extra: pyarrow is 55 MB, and local folders do without it); a remote adapter is
copied to a local folder before it is loaded.
"""

from __future__ import annotations

import json
import re
import struct
import tempfile
from collections.abc import Collection, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import Field, field_validator

from deployments.config.gguf import read_gguf
from deployments.config.strict import StrictModel

ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # whole names only (`fullmatch`)
CONFIG_FILE = "adapter_config.json"


class LoraConfig(StrictModel):
    """LoRA adapters served on top of the model (transformers: PEFT folders; llama.cpp: GGUF adapter files)."""

    adapters: dict[str, str] = Field(
        default_factory=dict,
        description="Adapter name -> its folder (PEFT's save_pretrained output: adapter_config.json and "
        "adapter_model.safetensors; on llama.cpp a GGUF adapter file): a local path (relative to models.yaml), "
        "package:NAME/SUBDIR inside an installed package, or a storage URI read through pyarrow.fs (s3://, gs://, "
        "hdfs://). Each is checked when the service is built. A request names one as model '<base>:<adapter>' or by "
        "the adapter's name alone.",
    )
    dynamic_path: str | None = Field(
        None,
        description="A folder or URI where an adapter named in a request ('<base>:<name>') and not listed in "
        "adapters is looked up as <dynamic_path>/<name>, when a replica first needs it (404 when it is not there).",
    )
    max_adapters_per_replica: int = Field(
        4,
        gt=0,
        description="Adapters one decoder replica holds at once (Serve's max_num_models_per_replica); loading "
        "another evicts the least recently used (after its running requests end).",
    )
    max_rank: int = Field(64, gt=0, description="The largest LoRA rank (r) accepted; a larger adapter is refused.")
    check_base: bool = Field(
        True,
        description="Refuse an adapter whose adapter_config.json names a base model (base_model_name_or_path) "
        "whose last path component is not the model's (hf_id or local_path).",
    )

    @field_validator("adapters")
    @classmethod
    def _names(cls, adapters: dict[str, str]) -> dict[str, str]:
        for name in adapters:
            if not ADAPTER_NAME.fullmatch(name):
                raise ValueError(f"adapter name {name!r}: letters, digits, '.', '_' and '-' only (no ':' or '/')")
        return adapters


class AdapterError(ValueError):
    """An adapter's folder cannot be used: missing, not a LoRA adapter, too high a rank, another base."""


class AdapterMissing(AdapterError):
    """No adapter folder at that path."""


def is_uri(path: str) -> bool:
    """Whether an adapter's path is a storage URI (``s3://``, ``gs://``, ...) rather than a local folder."""
    return "://" in path


def _filesystem(uri: str) -> tuple[Any, str]:
    """`pyarrow.fs`'s filesystem and path for a storage URI (pyarrow is an extra: ``mmserve[lora-storage]``)."""
    try:
        from pyarrow import fs
    except ImportError:
        raise AdapterError(f"{uri}: reading adapters from storage URIs needs pyarrow (pip install pyarrow)") from None
    return fs.FileSystem.from_uri(uri)


def read_adapter_config(path: str) -> dict[str, Any]:
    """The adapter's adapter_config.json (a local folder, or a URI through `pyarrow.fs`);
    `AdapterMissing` when there is none.
    """
    if is_uri(path):
        from pyarrow import fs

        filesystem, root = _filesystem(path)
        config_path = str(PurePosixPath(root) / CONFIG_FILE)
        if filesystem.get_file_info(config_path).type != fs.FileType.File:
            raise AdapterMissing(f"{path}: no {CONFIG_FILE} there")
        with filesystem.open_input_stream(config_path) as stream:
            text = stream.read()
    else:
        local = Path(path) / CONFIG_FILE
        if not local.is_file():
            raise AdapterMissing(f"{path}: no {CONFIG_FILE} there")
        text = local.read_bytes()
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise AdapterError(f"{path}/{CONFIG_FILE}: not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{path}/{CONFIG_FILE}: not a JSON object")
    return config


def check_adapter(path: str, lora: LoraConfig, base: str, base_gguf: str | None = None) -> dict[str, Any]:
    """The adapter's config, checked: a LoRA adapter, rank within `lora.max_rank`, made for `base`
    (when `lora.check_base` and the adapter names its base). A ``.gguf`` file is llama.cpp's adapter
    (`check_gguf_adapter`, against the model's GGUF file `base_gguf` when given). `AdapterError`
    says which and why.
    """
    if path.lower().endswith(".gguf"):
        return check_gguf_adapter(path, lora, base_gguf)
    config = read_adapter_config(path)
    kind = str(config.get("peft_type", "LORA")).upper()
    if kind != "LORA":
        raise AdapterError(f"{path}: a {kind} adapter, not LoRA")
    rank = config.get("r")
    if not isinstance(rank, int) or rank <= 0:
        raise AdapterError(f"{path}: no LoRA rank (r) in {CONFIG_FILE}")
    if rank > lora.max_rank:
        raise AdapterError(f"{path}: rank {rank} is over max_rank {lora.max_rank}")
    named = config.get("base_model_name_or_path")
    if lora.check_base and named and _last_part(named) != _last_part(base):
        raise AdapterError(f"{path}: made for base model {named!r}, not {base!r}")
    return config


def check_gguf_adapter(path: str, lora: LoraConfig, base_gguf: str | None) -> dict[str, Any]:
    """A GGUF LoRA adapter (``general.type: adapter``, ``adapter.type: lora``), its rank within
    `lora.max_rank`, and, with the base model's GGUF file, each ``<tensor>.lora_a`` / ``.lora_b``
    pair shaped for the base's ``<tensor>`` (another base's adapter fails here, not in llama.cpp).
    """
    if is_uri(path):
        raise AdapterError(f"{path}: a GGUF adapter is read from a local file (copy it to the replicas' machines)")
    if not Path(path).is_file():
        raise AdapterMissing(f"{path}: no such file")
    try:
        meta, shapes = read_gguf(Path(path))
    except (ValueError, OSError, struct.error) as exc:
        raise AdapterError(f"{path}: not a GGUF file ({exc})") from None
    kind, adapter = meta.get("general.type"), meta.get("adapter.type")
    if (kind, adapter) != ("adapter", "lora"):
        raise AdapterError(f"{path}: not a GGUF LoRA adapter (general.type {kind!r}, adapter.type {adapter!r})")
    ranks = {shape[-1] for name, shape in shapes.items() if name.endswith(".lora_a")}  # lora_a: [in, r]
    if not ranks:
        raise AdapterError(f"{path}: no LoRA tensors (*.lora_a)")
    if max(ranks) > lora.max_rank:
        raise AdapterError(f"{path}: rank {max(ranks)} is over max_rank {lora.max_rank}")
    if base_gguf is not None and lora.check_base:
        base = read_gguf(Path(base_gguf))[1]
        for name, shape in shapes.items():
            if not name.endswith(".lora_a"):
                continue
            target = name.removesuffix(".lora_a")
            b_shape = shapes.get(f"{target}.lora_b", [0, 0])
            if target not in base or [shape[0], b_shape[-1]] != base[target][:2]:
                raise AdapterError(
                    f"{path}: made for another base: {target} is {base.get(target)} in {base_gguf}, "
                    f"the adapter's is {[shape[0], b_shape[-1]]}"
                )
    return {"peft_type": "LORA", "r": max(ranks)}


def _last_part(name: str) -> str:
    return PurePosixPath(str(name).rstrip("/")).name.lower()


def local_copy(path: str) -> Path:
    """A local folder with the adapter's files: `path` itself when local, else a copy of the URI's
    folder in a new temporary folder.
    """
    if not is_uri(path):
        return Path(path)
    filesystem, root = _filesystem(path)
    from pyarrow import fs

    target = Path(tempfile.mkdtemp(prefix="mmserve-lora-"))
    fs.copy_files(root, str(target), source_filesystem=filesystem, destination_filesystem=fs.LocalFileSystem())
    return target


def adapter_path(lora: LoraConfig, name: str) -> str | None:
    """Where adapter `name` is: its listed path, else under `dynamic_path`; None: nowhere to look."""
    if name in lora.adapters:
        return lora.adapters[name]
    if lora.dynamic_path is None or not ADAPTER_NAME.fullmatch(name):
        return None
    return lora.dynamic_path.rstrip("/") + "/" + name


def named_adapter(
    name: str, listed: Mapping[str, Collection[str]], dynamic: Collection[str], taken: Collection[str]
) -> tuple[str, str] | None:
    """`(model, adapter)` that a request's `model` names, or None: ``<model>:<adapter>`` (a listed
    adapter, or any under the model's `dynamic_path`), or a listed adapter's own name when only one
    model lists it and no model (`taken`: every served name) is called that. `listed`: each model's
    listed adapters; `dynamic`: the models with a `dynamic_path`.
    """
    owners = [model for model, adapters in listed.items() if name in adapters]
    if len(owners) == 1 and name not in taken:
        return owners[0], name
    base, colon, adapter = name.rpartition(":")
    if colon and adapter and base in listed and (adapter in listed[base] or base in dynamic):
        return base, adapter
    return None

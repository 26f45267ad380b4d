"""Load-progress lines in the replica log, shared by every engine library (torch-free): one INFO line
per step of a model's load, with its time and bytes, all starting ``loading <role> '<name>':``.

For example::

    loading decoder 'smollm2': source local GGUF /m/SmolLM2-135M-Instruct.Q4_1.gguf (98.4 MB)
    loading decoder 'smollm2': step=download 0.0 s (local, 98.4 MB on disk)
    loading decoder 'smollm2': step=load 0.9 s (...what the engine did...)
    loading decoder 'smollm2': done in 1.0 s (rss 420.3 MB)

`LoadLog` writes them; each engine library says what its steps were (the transformers engines:
`transformers/progress.py`). Sizes are decimal: 1 MB is 10^6 bytes. `HubCache` is the hub cache's
folder of one repository, where a download shows as new blobs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

import psutil

from deployments.config import ModelConfig

logger = logging.getLogger("ray.serve")


def size_text(n: int | None) -> str:
    """A byte count as the load lines write it (decimal: kB, MB, GB)."""
    if n is None:
        return "size unknown"
    if n >= 10**9:
        return f"{n / 1e9:.1f} GB"
    if n >= 10**6:
        return f"{n / 1e6:.1f} MB"
    return f"{n / 1e3:.1f} kB"


def file_size(path: Path) -> int | None:
    """A file's bytes, its symlinks followed; None when it cannot be read."""
    try:
        return path.stat().st_size  # follows the hub cache's snapshot symlinks to their blobs
    except OSError:
        return None


def tree_size(folder: Path) -> tuple[int, int]:
    """`(bytes, files)` of the regular files under `folder` (0, 0 when it cannot be read)."""
    total = count = 0
    for path in folder.rglob("*"):
        if (size := file_size(path)) is not None and path.is_file():
            total, count = total + size, count + 1
    return total, count


class HubCache:
    """One model repository's folder in the Hugging Face hub cache (`models--org--name`)."""

    def __init__(self, repo_id: str) -> None:
        from huggingface_hub import constants
        from huggingface_hub.file_download import repo_folder_name

        self.folder = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")

    def blobs(self) -> dict[str, float]:
        """Complete blobs (downloads in progress end in `.incomplete`) and their modification times."""
        found: dict[str, float] = {}
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.folder / "blobs"):
                if entry.is_file() and not entry.name.endswith(".incomplete"):
                    found[entry.name] = entry.stat().st_mtime
        return found

    def snapshot(self, revision: str = "main") -> Path | None:
        """The cached snapshot of `revision` (what `from_pretrained` loads), if there is one."""
        try:
            commit = (self.folder / "refs" / revision).read_text().strip()
        except OSError:
            return None
        path = self.folder / "snapshots" / commit
        return path if path.is_dir() else None

    def blob_bytes(self, names: set[str]) -> int:
        return sum(file_size(self.folder / "blobs" / name) or 0 for name in names)


class LoadLog:
    """The lines of one engine's load: the source when created, then `step`s, then `finished`."""

    def __init__(self, role: str, model: ModelConfig) -> None:
        self._prefix = f"loading {role} {model.name!r}"
        self._model = model
        self._start = time.monotonic()
        self._hub = HubCache(model.source) if model.local_path is None else None
        self.log(f"source {self.describe_source()}")

    def log(self, text: str, level: int = logging.INFO) -> None:
        logger.log(level, "%s: %s", self._prefix, text)

    def describe_source(self) -> str:
        model = self._model
        if self._hub is None:
            local = Path(model.source)
            if model.weight_file:
                gguf = local / model.weight_file
                return f"local GGUF {gguf} ({size_text(file_size(gguf))})"
            size, files = tree_size(local)
            return f"local directory {local} ({size_text(size)} in {files} files)"
        what = f"hub {model.source}" + (f" GGUF {model.weight_file}" if model.weight_file else "")
        snapshot = self._hub.snapshot()
        if snapshot is None:
            return f"{what} (not in the hub cache {self._hub.folder.parent})"
        return f"{what} (hub cache: {size_text(tree_size(snapshot)[0])} in {snapshot})"

    def step(self, name: str, seconds: float, note: str) -> None:
        self.log(f"step={name} {seconds:.1f} s ({note})")

    def failed(self, what: str, started: float, exc: BaseException) -> None:
        """Where a load stopped, at INFO: the failure itself, with its cause and next attempt, is the
        replica's one line (`replicas.lifecycle.EngineSlot`).
        """
        self.log(f"{what} failed after {time.monotonic() - started:.1f} s ({type(exc).__name__})")

    def finished(self, memory: str = "") -> None:
        """The closing line: total time and the process's RSS (`memory`: more to say after it)."""
        rss = f"rss {size_text(psutil.Process().memory_info().rss)}"
        self.log(f"done in {time.monotonic() - self._start:.1f} s ({rss}{memory})")

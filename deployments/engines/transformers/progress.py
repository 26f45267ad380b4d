"""Model loading progress of the transformers engines in the replica log: one INFO line per step,
with its time and bytes (the lines and their helpers: `deployments/engines/load_log.py`).

`LoadProgress` follows one transformers engine's load and logs to the `ray.serve` logger, e.g.::

    loading decoder 'smollm2': source local GGUF /m/SmolLM2-135M-Instruct.Q4_1.gguf (98.4 MB)
    loading decoder 'smollm2': step=download 0.0 s (local, 98.4 MB on disk)
    loading decoder 'smollm2': step=load 17.0 s (tokenizer 3.9 s, model 13.1 s; model: convert GGUF ->
        float32 and load inside from_pretrained, not timed apart; 538.1 MB of weights, float32 on cpu)
    loading decoder 'smollm2': step=quantize 0.5 s (int4-cpu, 210 layers; weights 538.1 MB -> 353.1 MB)
    loading decoder 'smollm2': done in 17.5 s (rss 1.2 GB)

A hub source is fetched inside `from_pretrained` (the tokenizer's files first, then the model's), so
the download is not a call of its own: the blobs that appear in the repo's folder of the hub cache
during a call are what it fetched, and the time from the call's start to the last of them written
is its download time; the rest of the call is load. Nothing fetched: "cached" (the hub's freshness
checks, when online, stay in the load time). Weight bytes are file sizes on disk (the GGUF file, the
local directory, or the cached snapshot of the revision loaded); loaded bytes are the model's
parameters and buffers. Sizes are decimal: 1 MB is 10^6 bytes.

There is no warm-up step: on CPU a first forward pass costs no more than the next ones, and the
continuous batching engine's slower first request is its manager's first step, which a forward pass
of the model does not shorten.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from deployments.config import ModelConfig
from deployments.engines.load_log import LoadLog, file_size, size_text, tree_size

__all__ = ["LoadProgress", "module_bytes", "size_text", "tree_size"]

T = TypeVar("T")


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes of a model's parameters and buffers (each shared tensor once)."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


class LoadProgress(LoadLog):
    """Logs the steps of one engine's load. `pretrained` wraps each `from_pretrained` call, `loaded`
    logs the download and load steps, `quantize` times the post-load quantization, `done` closes.
    """

    def __init__(self, role: str, model: ModelConfig) -> None:
        super().__init__(role, model)
        self._calls: list[tuple[str, float]] = []  # (part, seconds of load after any download)
        self._first_call: float | None = None
        self._download_s = 0.0
        self._fetched: set[str] = set()

    def pretrained(self, part: str, load: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`load(*args, **kwargs)` (a `from_pretrained`), timed; for a hub source, what it fetched."""
        before = self._hub.blobs() if self._hub else {}
        wall, start = time.time(), time.monotonic()
        if self._first_call is None:
            self._first_call = start
        try:
            result = load(*args, **kwargs)
        except BaseException as exc:
            self.failed(f"{part} from_pretrained", start, exc)
            raise
        took = time.monotonic() - start
        fetched = {n: t for n, t in (self._hub.blobs() if self._hub else {}).items() if n not in before}
        download = min(max(max(fetched.values()) - wall, 0.0), took) if fetched else 0.0
        self._download_s += download
        self._fetched |= fetched.keys()
        self._calls.append((part, took - download))
        return result

    def _download_note(self) -> str:
        if self._hub is None:
            if self._model.weight_file:
                on_disk = file_size(Path(self._model.source) / self._model.weight_file)
            else:
                on_disk = tree_size(Path(self._model.source))[0]
            return f"local, {size_text(on_disk)} on disk"
        snapshot = self._hub.snapshot()
        cached = size_text(tree_size(snapshot)[0]) if snapshot else "nothing"
        if not self._fetched:
            return f"cached, {cached} in the hub cache"
        fetched = size_text(self._hub.blob_bytes(self._fetched))
        return (
            f"fetched {fetched} in {len(self._fetched)} files from the hub inside from_pretrained, timed to the "
            f"last file written; {cached} in the hub cache now"
        )

    def loaded(self, module: torch.nn.Module, kwargs: dict[str, Any]) -> None:
        """Log the download and load steps, once the weights are loaded and placed."""
        self.step("download", self._download_s, self._download_note())
        load_s = time.monotonic() - (self._first_call or self._start) - self._download_s
        parts = [f"{part} {seconds:.1f} s" for part, seconds in self._calls]
        if (rest := load_s - sum(seconds for _, seconds in self._calls)) >= 0.05:
            parts.append(f"placing {rest:.1f} s")  # `place`: the move to the device
        notes = [", ".join(parts)]
        if self._model.weight_file:
            notes.append(f"model: convert GGUF -> {_dtype(module)} and load inside from_pretrained, not timed apart")
        if "quantization_config" in kwargs:  # bitsandbytes
            notes.append(f"{self._model.params.quantization} quantization inside from_pretrained, not timed apart")
        devices = "+".join(sorted({str(p.device) for p in module.parameters()}))
        notes.append(f"{size_text(module_bytes(module))} of weights, {_dtype(module)} on {devices}")
        self.step("load", load_s, "; ".join(notes))

    def quantize(self, module: torch.nn.Module, what: str, quantize: Callable[[], int]) -> int:
        """Run the post-load quantization `quantize` (returns the layers it replaced) as a timed step."""
        before, start = module_bytes(module), time.monotonic()
        try:
            layers = quantize()
        except BaseException as exc:
            self.failed("step=quantize", start, exc)
            raise
        after = size_text(module_bytes(module))
        self.step(
            "quantize", time.monotonic() - start, f"{what}, {layers} layers; weights {size_text(before)} -> {after}"
        )
        return layers

    def done(self, module: torch.nn.Module) -> None:
        """The closing line: total time, the process's RSS and, on GPUs, torch's peak allocation on
        the GPUs holding the model (since the process started: a reload loads the same model).
        """
        gpus = {p.device.index or 0 for p in module.parameters() if p.device.type == "cuda"}
        peak = sum(torch.cuda.max_memory_allocated(i) for i in gpus) if gpus else 0
        self.finished(f", cuda peak {size_text(peak)}" if gpus else "")


def _dtype(module: torch.nn.Module) -> str:
    """A transformers model's `dtype` (that of its floating point parameters), else its first parameter's."""
    dtype = getattr(module, "dtype", None) or next((p.dtype for p in module.parameters()), "unknown")
    return str(dtype).removeprefix("torch.")

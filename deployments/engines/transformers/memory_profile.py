"""Worst-case memory profiling of a native VLM at start (vLLM's dummy inputs).

The replica builds the largest batch its settings allow: `max_num_seqs` requests, each with the
model's image limit of images at the largest size (a square at the ingress's default pixel cap,
which the processor then shrinks to its own maximum) and text up to `max_model_len`, runs it once
(prefill and one decode step) and records the peak: the CUDA allocator's on a GPU, the process's
resident memory (VmHWM, reset first where the kernel allows) on a CPU. Over the budget
(`params.mem_budget_mb`; on a GPU by default the card's memory times the replica's share), the
replica refuses to start, naming the settings to lower.
"""

from __future__ import annotations

import contextlib
import math
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from deployments.config import ImageInputConfig
from deployments.errors import ConfigError

MB = 2**20


@dataclass(frozen=True)
class MemoryProfile:
    """The worst-case batch and its peak, MB (what the budget is compared with)."""

    peak_mb: int
    budget_mb: int | None
    measured: str  # "cuda_max_allocated" or "process_peak_rss"
    seqs: int
    images_per_seq: int
    image_tokens_per_image: int
    prompt_tokens: int
    seconds: float

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def largest_image() -> Image.Image:
    """A square image at the ingress's default pixel cap (`images.max_image_pixels`): at least as large
    as what any processor keeps after resizing to its own maximum.
    """
    side = math.isqrt(ImageInputConfig().max_image_pixels)
    return Image.new("RGB", (side, side), (128, 128, 128))


def _reset_peak(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
        return
    # Linux: "5" resets the process's peak resident set size (VmHWM). Where it cannot, the peak since
    # the process started is read instead: larger, so on the safe side.
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _peak_mb(device: str) -> int:
    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated(device) // MB)
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # KB on Linux


def default_budget_mb(device: str) -> int | None:
    """On a GPU, the card's memory times the replica's share (Ray's GPU resource); none on a CPU."""
    if not device.startswith("cuda"):
        return None
    share = 1.0
    try:
        import ray

        if ray.is_initialized():
            share = min(1.0, float(ray.get_runtime_context().get_assigned_resources().get("GPU", 1.0)))
    except Exception:  # outside a replica: the whole card
        share = 1.0
    return int(torch.cuda.get_device_properties(device).total_memory * share // MB)


def measure(device: str, run: Any) -> tuple[int, float]:
    """`(peak MB, seconds)` of `run()`."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    _reset_peak(device)
    started = time.monotonic()
    run()
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    return _peak_mb(device), time.monotonic() - started


def check_budget(profile: MemoryProfile) -> None:
    """`ConfigError` naming the settings to lower when the worst-case batch does not fit the budget."""
    if profile.budget_mb is None or profile.peak_mb <= profile.budget_mb:
        return
    raise ConfigError(
        f"native vision memory profile: the worst-case batch ({profile.seqs} requests x {profile.images_per_seq} "
        f"images of {profile.image_tokens_per_image} image tokens, {profile.prompt_tokens} prompt tokens each) "
        f"peaked at {profile.peak_mb} MB ({profile.measured}), over the budget of {profile.budget_mb} MB "
        "(params.mem_budget_mb): lower params.max_num_seqs, capabilities.max_images_per_request or "
        "params.max_model_len, or raise params.mem_budget_mb"
    )

"""What the configuration is resolved against on this machine (torch-free: the builder uses it)."""

from __future__ import annotations

import os


def cpu_cores() -> int:
    """Cores this process may run on: its CPU affinity (a container's cpuset), not the host's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

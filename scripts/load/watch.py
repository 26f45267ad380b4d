"""What the load test watches on the service while it runs: /health's status over time, the
decoder's slots after the load, and its resources, sampled every so often and judged at the end.

Each resource sample holds, for every Serve process (replicas, proxy, controller), its resident memory and
open file descriptors; the caption cache's entries and bytes (from /health); and the Ray object
store's use. `growth` compares each replica's memory at its first sample from 5 minutes into its
life with its last: a replica that grows more than `max_growth` is a leak. (A replica that a kill
replaced is judged from 5 minutes after it was first seen.)
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil

SETTLE_S = 300.0  # memory is judged from 5 minutes in: loading, warm-up and first allocations are over


def serve_processes(root_pid: int | None) -> dict[str, psutil.Process]:
    """`name#pid` -> process for every Serve actor process (descendants of `root_pid` when given)."""
    candidates = psutil.Process(root_pid).children(recursive=True) if root_pid else psutil.process_iter()
    found = {}
    for proc in candidates:
        try:
            title = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if match := re.match(r"ray::(ServeReplica:[\w-]+:\w+|ServeController|ProxyActor)", title):
            found[f"{match.group(1).removeprefix('ServeReplica:')}#{proc.pid}"] = proc
    return found


def object_store_mb(address: str | None) -> float | None:
    """Plasma memory in use on the cluster at `address`, MiB (None without an address or an answer)."""
    if address is None:
        return None
    from ray._private.internal_api import memory_summary

    try:
        match = re.search(r"Plasma memory usage (\d+) MiB", memory_summary(address=address, stats_only=True))
    except Exception:  # the cluster is busy restarting a replica: no figure this time
        return None
    return float(match.group(1)) if match else None


@dataclass
class ResourceWatch:
    root_pid: int | None
    ray_address: str | None
    t0: float = field(default_factory=time.monotonic)
    samples: list[dict[str, Any]] = field(default_factory=list)

    def sample(self, health: dict[str, Any] | None) -> None:
        rss, fds = {}, {}
        for name, proc in serve_processes(self.root_pid).items():
            try:
                rss[name], fds[name] = proc.memory_info().rss // 2**20, proc.num_fds()
            except psutil.Error:  # it just went away (a kill)
                continue
        cache = ((health or {}).get("components", {}).get("captioner") or {}).get("cache") or {}
        self.samples.append(
            {
                "t_s": round(time.monotonic() - self.t0),
                "rss_mb": rss,
                "open_fds": fds,
                "caption_cache": {k: cache.get(k) for k in ("entries", "bytes")},
                "object_store_mb": object_store_mb(self.ray_address),
            }
        )

    def growth(self, max_growth: float) -> dict[str, Any]:
        """Per replica process: RSS at its first settled sample and at its last, and the verdict."""
        result = {}
        names = {name for s in self.samples for name in s["rss_mb"] if not name.startswith(("Serve", "Proxy"))}
        for name in sorted(names):
            seen = [(s["t_s"], s["rss_mb"][name]) for s in self.samples if name in s["rss_mb"]]
            settled = [(t, mb) for t, mb in seen if t >= seen[0][0] + SETTLE_S]
            if len(settled) < 2:
                result[name] = {"judged": False, "why": "not alive long enough after settling"}
                continue
            (t1, first), (t2, last) = settled[0], settled[-1]
            grew = (last - first) / first
            result[name] = {"from": [t1, first], "to": [t2, last], "growth": round(grew, 4), "ok": grew <= max_growth}
        return result

    def table(self) -> list[str]:
        """Markdown rows: minute, each process's RSS, fds in total, cache entries, object store."""
        names = sorted({n for s in self.samples for n in s["rss_mb"]})
        rows = ["| min | " + " | ".join(names) + " | fds | cache entries | object store MiB |"]
        rows.append("|" + "---|" * (len(names) + 4))
        for s in self.samples:
            cells = [str(s["rss_mb"].get(n, "")) for n in names]
            fds = sum(s["open_fds"].values())
            extra = [str(fds), str(s["caption_cache"]["entries"]), str(s["object_store_mb"])]
            rows.append(f"| {s['t_s'] / 60:.0f} | " + " | ".join(cells + extra) + " |")
        return rows


async def health(client: httpx.AsyncClient) -> dict[str, Any]:
    try:
        return (await client.get("/health", timeout=15)).json()
    except (httpx.HTTPError, ValueError) as exc:
        return {"status": f"unreachable: {type(exc).__name__}"}


async def watch_health(client: httpx.AsyncClient, t0: float, finished: asyncio.Event, timeline: list[tuple]) -> None:
    """/health once a second; records each change of its status (and which components are not ready)."""
    last = None
    while not finished.is_set():
        data = await health(client)
        down = sorted(k for k, c in data.get("components", {}).items() if not c.get("ready"))
        state = data.get("status", "?") + (f" ({','.join(down)} not ready)" if down else "")
        if state != last:
            timeline.append((round(time.monotonic() - t0, 1), state))
            last = state
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(finished.wait(), 1.0)


async def watch_resources(
    client: httpx.AsyncClient, watch: ResourceWatch, every_s: float, finished: asyncio.Event
) -> None:
    while True:
        await asyncio.to_thread(watch.sample, await health(client))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(finished.wait(), every_s)
            return


async def slots_free_after_s(client: httpx.AsyncClient, within_s: float = 30.0) -> float | None:
    """Seconds after the load until /health showed no running or waiting sequence five times in a row
    (each answer comes from one decoder replica); None if it never did within `within_s`.
    """
    start, streak = time.monotonic(), 0
    while (elapsed := time.monotonic() - start) < within_s:
        details = (await health(client)).get("components", {}).get("decoder", {}).get("details", {})
        busy = details.get("running", 0) + details.get("waiting", 0)
        streak = streak + 1 if busy == 0 and "busy" not in details else 0
        if streak == 5:
            return round(elapsed, 1)
        await asyncio.sleep(0.2)
    return None

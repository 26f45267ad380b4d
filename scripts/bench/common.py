"""What the benchmarks share (and scripts/loadtest.py with them): a subcommand's argument parser and
its JSON lines, a server run in its own process group (ours through `serve run`, or the peer), the
models.yaml it serves, the prompts and the closed loop, distinct test images and percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import yaml
from openai import AsyncOpenAI
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]


def arguments(subcommand: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of ``python -m scripts.bench SUBCOMMAND``, its help the module's docstring."""
    return argparse.ArgumentParser(
        prog=f"python -m scripts.bench {subcommand}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


@dataclass(frozen=True)
class Streamed:
    """One streamed chat's clock (`time.perf_counter`): sent, first content chunk, end; and its
    completion tokens (the usage's, else the content chunks).
    """

    start: float
    first: float | None
    end: float
    tokens: int


async def streamed_chat(client: AsyncOpenAI, model: str, prompt: str, max_tokens: int, **extra: Any) -> Streamed:
    """One greedy chat of one user message, streamed with its usage; `extra`: more request fields."""
    start, first, chunks, usage = time.perf_counter(), None, 0, None
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        **extra,
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            chunks += 1
            first = first or time.perf_counter()
        if chunk.usage:
            usage = chunk.usage.completion_tokens
    return Streamed(start, first, time.perf_counter(), usage if usage is not None else chunks)


def emit(record: dict[str, Any]) -> None:
    """One JSON line of results."""
    print(json.dumps(record), flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


class Endpoint(Protocol):
    """What a workload needs of a server: its name in the results and where it answers."""

    name: str
    base_url: str


class Server:
    def __init__(self, name: str, cmd: list[str], base_url: str, ready_path: str, env: dict[str, str]) -> None:
        self.name, self.base_url, self.ready_path = name, base_url, ready_path
        self.log = open(Path(tempfile.gettempdir()) / f"bench-{name}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env={**os.environ, **env}, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_ready(self, predicate: Callable[[httpx.Response], bool], timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited; see {self.log.name}")
            try:
                if predicate(httpx.get(self.base_url + self.ready_path, timeout=5)):
                    return
            except (httpx.HTTPError, ValueError):  # not up yet, or not JSON yet
                pass
            time.sleep(2)
        self.stop()
        raise SystemExit(f"{self.name} not ready after {timeout_s}s; see {self.log.name}")

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()
        # Ray's proxy can outlive `serve run` by seconds, and the next server's proxy binds the same
        # port beside it (SO_REUSEPORT): wait until nothing answers, or the next run talks to this one.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(self.base_url + self.ready_path, timeout=2)
            except httpx.HTTPError:
                return
            time.sleep(1)
        raise SystemExit(f"{self.name} still answers on {self.base_url} a minute after it was stopped")


def ray_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """scripts/ray_env.sh's settings as run.sh exports them from `environ` (a value set there wins)."""
    lines = (ROOT / "scripts/ray_env.sh").read_text().splitlines()
    found = (re.fullmatch(r'export (\w+)="\$\{\1:-(.*)\}"', line) for line in lines)
    return {m[1]: environ.get(m[1], m[2]) for m in found if m}


def start_ours(
    models_file: Path,
    port: int,
    decoder_replicas: int = 0,
    quantization: str | None = None,
    name: str = "ours",
    vision: bool = True,
    args: Mapping[str, Any] | None = None,
) -> Server:
    """`serve run` with the repository's serve_config.yaml, in run.sh's environment (`ray_env`).
    `decoder_replicas` > 0: that many decoder replicas on a CPU-only machine, sharing its cores
    (`decoder_cpu_replicas`; 0: as shipped).
    `vision`: ready only once a captioner is (False: `models_file` serves no vision); `args`: more builder args.
    """
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"]["port"] = port
    for app in config["applications"]:
        app["args"] = {**app["args"], "models_file": str(models_file), **(args or {})}
    if quantization:
        config["applications"][0]["args"]["decoder.quantization"] = quantization
    if decoder_replicas:
        config["applications"][0]["args"]["decoder_cpu_replicas"] = decoder_replicas

    def ready(response: httpx.Response) -> bool:
        components = response.json().get("components", {})
        return all(c.get("ready") for c in components.values()) and ("captioner" in components or not vision)

    return serve_run(name, config, models_file.parent / "serve_config.yaml", "/health", ready)


def serve_run(
    name: str, config: dict[str, Any], path: Path, ready_path: str, ready: Callable[[httpx.Response], bool]
) -> Server:
    """`serve run` of a Serve config (written to `path`) in run.sh's environment (`ray_env`), once
    `ready_path` answers as `ready` wants.
    """
    path.write_text(yaml.safe_dump(config))
    server = Server(
        name,
        [sys.executable, "-m", "ray.serve.scripts", "run", str(path)],  # `serve run`, also where no .venv is
        f"http://127.0.0.1:{config['http_options']['port']}",
        ready_path,
        {**ray_env(), "HF_HUB_OFFLINE": "1", "RAY_AUTH_MODE": "token", "PYTHONPATH": str(ROOT)},
    )
    server.wait_ready(ready)
    return server


def primary_name() -> str:
    """The name of models.yaml's first model (the primary the benchmarks ask for)."""
    return str(yaml.safe_load((ROOT / "models.yaml").read_text())["models"][0]["name"])


def start_peer(model_dir: Path, port: int, dtype: str) -> Server:
    server = Server(
        "peer",
        [
            *(str(ROOT / ".venv/bin/transformers"), "serve", str(model_dir), "--continuous-batching"),
            *("--port", str(port), "--dtype", dtype),
        ],
        f"http://127.0.0.1:{port}",
        "/health",
        {"HF_HUB_OFFLINE": "1"},
    )
    server.wait_ready(lambda r: r.status_code == 200)
    return server


def start_llama_server(
    binary: Path, port: int, gguf: Path, slots: int, cells: int, unified: bool, threads: int, threads_batch: int
) -> Server:
    """A `llama-server` built by the user, laid out as the llama.cpp engine runs the same file: `slots`
    parallel sequences over `cells` KV cells (one pool when `unified`), `threads` threads for one-token
    steps and `threads_batch` for batched ones, and, as the engine, no host-memory prompt cache.
    """
    server = Server(
        "llama-server",
        [
            *(str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)),
            *("-np", str(slots), "-c", str(cells), "-t", str(threads), "-tb", str(threads_batch)),
            *("--kv-unified" if unified else "--no-kv-unified", "--cache-ram", "0"),
        ],
        f"http://127.0.0.1:{port}",
        "/health",
        {},
    )
    server.wait_ready(lambda r: r.status_code == 200)
    return server


def image_url(seed: int) -> str:
    img = Image.new("RGB", (96, 64), ((seed * 37) % 256, (seed * 91) % 256, (seed * 13) % 256))
    img.putpixel((seed % 96, seed % 64), (255, 255, 255))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def write_models(
    directory: Path,
    captioner: Path,
    max_batch_size: int,
    engine: str | None = None,
    params: Mapping[str, Any] | None = None,
) -> Path:
    """The repository's models.yaml with its primary (on `engine` when given, its params updated with
    `params`), and `captioner` in place of the shipped one (with the shipped one's params and
    captioning, but `max_batch_size` and 32-token captions).
    """
    models = yaml.safe_load((ROOT / "models.yaml").read_text())
    primary = models["models"][0]
    if engine:
        primary["engine"] = engine
    primary["params"] = {**primary.get("params", {}), **(params or {})}
    primary["local_path"] = str((ROOT / primary["local_path"]).resolve())
    shipped = next(m for m in models["models"] if m["name"] == primary["capabilities"]["captioner"])
    primary["capabilities"]["captioner"] = "bench-captioner"
    captioning = {**shipped.get("captioning", {}), "max_batch_size": max_batch_size, "max_new_tokens": 32}
    bench_captioner = {
        "name": "bench-captioner",
        "local_path": str(captioner),
        "params": shipped.get("params", {}),
        "captioning": captioning,
    }
    models["models"] = [primary, bench_captioner]
    path = directory / f"models-batch{max_batch_size}.yaml"
    path.write_text(yaml.safe_dump(models))
    return path


# Long answers, so that most requests run to the benchmark's max_tokens.
PROMPTS = [
    f"Write a short story about a {thing}."
    for thing in ["cat", "dog", "ship", "tree", "river", "robot", "city", "bird", "cloud", "train", "lamp", "fox"]
]

Timing = tuple[float, float, int]  # (TTFT s, end-to-end s, output tokens) of one request


def engine_chat(engine: Any, max_tokens: int) -> Callable[[str], Awaitable[Timing]]:
    """One greedy chat of one user message to a text engine in this process, timed as a client times
    the service: the first token is the first piece with text.
    """
    from deployments.protocol.replica import GenerateRequest, TextMessage

    async def one(prompt: str) -> Timing:
        start, ttft, tokens = time.perf_counter(), None, 0
        request = GenerateRequest(
            messages=[TextMessage(role="user", content=prompt)], max_tokens=max_tokens, temperature=0
        )
        async for piece in engine.generate(request):
            if piece.text and ttft is None:
                ttft = time.perf_counter() - start
            tokens = piece.completion_tokens
        return ttft or float("nan"), time.perf_counter() - start, tokens

    return one


async def closed_loop(
    one: Callable[[str], Awaitable[Timing]], concurrency: int, rounds: int
) -> tuple[list[Timing], float]:
    """`max(4, concurrency * rounds)` requests over `PROMPTS`, `concurrency` at a time, each worker
    sending its next as soon as the last is answered: every request's timing, and the wall time.
    """
    queue = list(range(max(4, concurrency * rounds)))
    results: list[Timing] = []

    async def worker() -> None:
        while queue:
            results.append(await one(PROMPTS[queue.pop() % len(PROMPTS)]))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results, time.perf_counter() - start

"""Agent sessions through the service, per decoder layout and router (issue 68): `--sessions` concurrent
sessions of `--turns` turns each, every session with its own long system text, each turn the whole
conversation so far plus a new question, streamed with usage (`cached_tokens`), as Codex, Claude Code or
a chat UI resend it.

Layouts (`--layouts`, one after the other; models.yaml's primary alone, or with `--gpu-shape` a random
model of that shape on the transformers engine, each replica at `--decoder-gpus` of a GPU):
- ``one``: one decoder replica with all the cores;
- ``serve``: two replicas, a core each, Serve's default router (power of two choices);
- ``ray``: two replicas, Ray Serve LLM's `PrefixCacheAffinityRouter` attached (`routing.ray_prefix`);
- ``ours``: two replicas, our router (`routing.router`);
- ``scale`` (not by default): ours, autoscaled 1 -> 2 -> 1 under the sessions (`scale_run`).

Cases (`--cases`; `--shared` adds ``shared``), each session's prompt:
- ``own``: its own system text;
- ``shared``: one common `--shared-tokens` system text first, then its own;
- ``image``: its own, then a user turn with its own picture, resent every turn (proxy vision: where the
  captioner cannot load, as the offline default's cannot without the hub, the ingress puts the same
  placeholder text in its place every turn; the line says whether the captioner was ready);
- ``adapter``: its own, under one of two random GGUF LoRA adapters of the primary (`lora_adapters`),
  session i under adapter i % 2. llama.cpp turns its prefix cache off where adapters are loaded, so
  cached shares are 0 there by design: the routing decisions say where the turns went.

Per layout and case one JSON line: warm turns' (turn 2 on) cached share of prompt tokens, warm TTFT p50 /
p95 / max, cold TTFT p50, wall time, requests per decoder replica and ours' routing decisions (from Ray's
metrics export: `routing_requests` / `routing_decisions`, else the replicas' `request_success`), and the
decoder replicas' resident memory after the case (`decoder_rss_mib`: with `--slots` and `--cache-ram-mib`,
what the host prompt cache costs).

    .venv/bin/python -m scripts.bench sessions    # --sessions 6 --turns 5 --system-tokens 1900 --new-tokens 24
    .venv/bin/python -m scripts.bench sessions --sessions 2 --turns 2 --system-tokens 300 --layouts one ours  # smoke
    .venv/bin/python -m scripts.bench sessions --layouts ours --cases image adapter
    .venv/bin/python -m scripts.bench sessions --layouts scale
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from scripts.bench.common import ROOT, Server, arguments, emit, serve_run, start_ours
from scripts.bench.overhead import decoder_models
from scripts.bench.serve import machine
from scripts.bench.session_client import WARM, Session, client_for, new_session, workload

LAYOUTS = {
    "one": (1, "prefix"),
    "serve": (2, "power_of_two"),
    "ray": (2, "ray_prefix_cache"),
    "ours": (2, "prefix"),
    "scale": (2, "prefix"),
}
CASES = ("own", "shared", "image", "adapter")
SERVER_KIND = {"own": "text", "shared": "text", "image": "image", "adapter": "adapter"}  # one server each
ADAPTER_RANK = 8


def ray_session() -> Path:
    """The folder of the Ray instance `serve run` started here: under RAY_TMPDIR, which `main` sets to a
    folder of its own, so that another Ray on the machine (a test, another benchmark) is not read.
    """
    return Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray" / "session_latest"


def routing_counts(model: str) -> dict[str, dict[str, float]]:
    """Requests per decoder replica and routing decisions so far, from Ray's metrics export (its port in
    the Ray session's folder): ours' `routing_requests` by decoder replica,
    else the decoder replicas' finished requests. Exported every few seconds: read after a pause.
    """
    from prometheus_client.parser import text_string_to_metric_families

    port = next(ray_session().glob("metrics_export_port_*")).read_text().strip()
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    routed: dict[str, float] = {}
    finished: dict[str, float] = {}
    decisions: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            if sample.name == "ray_mmserve_routing_requests_total":
                routed[sample.labels.get("decoder_replica", "?")] = sample.value
            elif sample.name == "ray_mmserve_routing_decisions_total":
                decisions[sample.labels.get("decision", "?")] = sample.value
            elif sample.name == "ray_mmserve_request_success_total":
                replica = sample.labels.get("replica", "?")
                finished[replica] = finished.get(replica, 0.0) + sample.value
    return {"replicas": routed or finished, "decisions": decisions}


def counted(model: str) -> dict[str, dict[str, float]]:
    time.sleep(12)  # Ray exports its metrics every few seconds
    try:
        return routing_counts(model)
    except (StopIteration, httpx.HTTPError):
        return {"replicas": {}, "decisions": {}}


def since(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, Any]:
    return {
        "requests_per_replica": {k: v - before["replicas"].get(k, 0.0) for k, v in after["replicas"].items()},
        "routing_decisions": {k: v - before["decisions"].get(k, 0.0) for k, v in after["decisions"].items()},
    }


def decoder_rss_mib() -> float:
    """The decoder replicas' resident memory (MiB), summed: their processes' titles name the deployment
    (``ray::ServeReplica:<app>:PrimaryDecoder``); with llama.cpp in process, its host prompt cache is in it.
    """
    import psutil

    total = 0
    for process in psutil.process_iter(["cmdline", "memory_info"]):
        title = " ".join(process.info["cmdline"] or [])
        if "ServeReplica" in title and "PrimaryDecoder" in title and process.info["memory_info"]:
            total += process.info["memory_info"].rss
    return round(total / 2**20, 1)


class DecoderReplicas:
    """The decoder's running replicas as Serve's controller logs them ("Replica(id=..., deployment=
    'PrimaryDecoder', ...) started successfully", "Removing 1 replica from Deployment(name='PrimaryDecoder'
    ..."), in the Ray session's folder.
    """

    STARTED = re.compile(r"deployment='PrimaryDecoder', app='[^']*'\) started successfully")
    REMOVED = re.compile(r"Removing (\d+) replicas? from Deployment\(name='PrimaryDecoder'")

    def count(self) -> int:
        total = 0
        for path in (ray_session() / "logs" / "serve").glob("controller_*.log"):
            text = path.read_text(errors="replace")
            total += len(self.STARTED.findall(text)) - sum(int(n) for n in self.REMOVED.findall(text))
        return total


async def scale_run(base_url: str, model: str, args: Any) -> dict[str, Any]:
    """Autoscaling 1 -> 2 -> 1 under sessions (issue 68). Up: `--sessions` sessions turn in rounds until
    Serve's second replica runs; then as many new sessions join them (they spread to it by load) for
    `--turns` rounds. Down: session 0 alone keeps turning until Serve removes a replica. After: each
    session takes two more turns, one session at a time (so that Serve keeps one replica). Every turn is
    one JSON line; the summary says whether any failed and whether each session's second turn after the
    removal was warm (its first may be cold: its prefix may have left with the replica).
    """
    client, replicas, t0 = client_for(base_url), DecoderReplicas(), time.perf_counter()
    sessions = [new_session(seed, model, args, "own", None) for seed in range(args.sessions)]
    errors: list[str] = []
    marks: dict[str, float | None] = {}
    after: dict[int, list[float | None]] = {}

    async def turn(session: Session, phase: str) -> None:
        count = replicas.count()
        try:
            t = await session.turn(client, args.new_tokens)
        except Exception as exc:  # every failure is counted, none stops the run
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
            emit({"phase": phase, "session": session.seed, "replicas": count, "error": errors[-1]})
            return
        if phase == "after":
            after.setdefault(session.seed, []).append(t.cached_share)
        at, ttft = round(time.perf_counter() - t0, 1), round(t.ttft_s, 3)
        line = {"t": at, "phase": phase, "session": t.session, "turn": t.turn, "replicas": count, "ttft_s": ttft}
        emit({**line, "cached_share": t.cached_share})

    def at() -> float:
        return round(time.perf_counter() - t0, 1)

    deadline = time.monotonic() + args.scale_timeout_s
    while replicas.count() < 2 and time.monotonic() < deadline:
        await asyncio.gather(*(turn(s, "up") for s in sessions))
    marks["two_replicas_at_s"] = at() if replicas.count() >= 2 else None
    sessions += [new_session(seed, model, args, "own", None) for seed in range(len(sessions), 2 * len(sessions))]
    for _ in range(args.turns):
        await asyncio.gather(*(turn(s, "up") for s in sessions))
    while replicas.count() >= 2 and time.monotonic() < deadline:
        await turn(sessions[0], "down")
    marks["one_replica_at_s"] = at() if replicas.count() < 2 else None
    for s in sessions:
        for _ in range(2):
            await turn(s, "after")
    second = [shares[1] for shares in after.values() if len(shares) > 1]
    return {
        **marks,
        "replicas_at_end": replicas.count(),
        "errors": len(errors),
        "after_first_turn_cached": [shares[0] for shares in after.values()],
        "after_second_turn_cached": second,
        "warm_within_one_turn": bool(second) and all((s or 0) >= WARM for s in second),
        "wall_s": at(),
    }


def models_for(directory: Path, base: dict[str, Any], layout: str, kind: str, args: Any) -> Path:
    """The layout's models.yaml: the primary with its router, (GPU) its replica count, (scale) its
    autoscaling, and for the image and adapter cases the captioner or two adapters.
    """
    replicas, router = LAYOUTS[layout]
    entry = copy.deepcopy(base)
    deployment = entry.setdefault("deployment", {})
    deployment["routing"] = {"router": router}
    params = entry.setdefault("params", {})
    if args.cache_ram_mib is not None:
        params["cache_ram_mib"] = args.cache_ram_mib
    if args.slots:
        params["max_num_seqs"] = args.slots
    if args.gpu_shape:
        params["max_model_len"] = 2048  # the random model's positions
        deployment["autoscaling"] = {"min_replicas": replicas, "max_replicas": replicas}
    if layout == "scale":
        deployment["autoscaling"] = {
            "min_replicas": 1,
            "max_replicas": 2,
            "target_ongoing_requests": 1,
            "upscale_delay_s": 2,
            "downscale_delay_s": args.downscale_delay_s,
            "look_back_period_s": 2,
            "metrics_interval_s": 1,
        }
    models = [entry]
    if kind == "image":
        shipped = yaml.safe_load((ROOT / "models.yaml").read_text())["models"]
        captioner = next(m for m in shipped if m["name"] == shipped[0]["capabilities"]["captioner"])
        if "local_path" in captioner:
            captioner["local_path"] = str((ROOT / captioner["local_path"]).resolve())
        entry["capabilities"] = {
            **entry.get("capabilities", {}),
            "vision_mode": "proxy",
            "captioner": captioner["name"],
        }
        models.append(captioner)
    if kind == "adapter":
        from scripts.bench.lora_adapters import build_gguf_lora

        gguf = Path(entry["local_path"]) / entry["weight_file"]
        adapters = {
            f"a{i}": str(build_gguf_lora(gguf, directory / f"a{i}.gguf", seed=i, rank=ADAPTER_RANK)) for i in (0, 1)
        }
        params["lora"] = {"adapters": adapters, "max_rank": ADAPTER_RANK}
    out = directory / f"models-{layout}-{kind}.yaml"
    out.write_text(yaml.safe_dump({"models": models}))
    return out


def start(models_file: Path, layout: str, kind: str, args: Any) -> Server:
    replicas = LAYOUTS[layout][0]
    on_gpu = bool(args.gpu_shape) and _cuda()
    builder = {"decoder_gpus": args.decoder_gpus} if on_gpu else {}
    cpu_replicas = 0 if on_gpu else replicas
    if kind != "image":
        return start_ours(models_file, args.port, cpu_replicas, name=f"sessions-{layout}", vision=False, args=builder)
    # As start_ours, but ready once the decoder is and the captioner is known, loaded or not.
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"]["port"] = args.port
    for app in config["applications"]:
        app["args"] = {**app["args"], "models_file": str(models_file), **builder}
    if cpu_replicas:
        config["applications"][0]["args"]["decoder_cpu_replicas"] = cpu_replicas

    def ready(response: httpx.Response) -> bool:
        components = response.json().get("components", {})
        return bool(components.get("decoder", {}).get("ready")) and "captioner" in components

    return serve_run(f"sessions-{layout}-image", config, models_file.parent / "serve_config.yaml", "/health", ready)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: list[str]) -> None:
    parser = arguments("sessions", __doc__)
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--system-tokens", type=int, default=1900, help="each session's own system text")
    parser.add_argument("--shared-tokens", type=int, default=1500, help="the shared case's common system text")
    parser.add_argument("--new-tokens", type=int, default=24, help="max_tokens of each turn")
    parser.add_argument("--layouts", nargs="+", choices=list(LAYOUTS), default=["one", "serve", "ray", "ours"])
    parser.add_argument("--cases", nargs="+", choices=CASES, default=["own"])
    parser.add_argument("--shared", action="store_true", help="also the shared case")
    parser.add_argument("--cache-ram-mib", type=int, default=None, help="params.cache_ram_mib (default: models.yaml's)")
    parser.add_argument("--slots", type=int, default=0, help="params.max_num_seqs (0: models.yaml's)")
    parser.add_argument("--downscale-delay-s", type=float, default=15, help="scale: Serve's downscale_delay_s")
    parser.add_argument("--scale-timeout-s", type=float, default=900, help="scale: the most its phases may take")
    parser.add_argument("--gpu-shape", default=None, help="a random model of this shape (scripts.bench.gpu)")
    parser.add_argument("--tokenizer", type=Path, default=None, help="--gpu-shape: its tokenizer")
    parser.add_argument("--decoder-gpus", type=float, default=0.5, help="--gpu-shape on a GPU: each replica's share")
    parser.add_argument("--port", type=int, default=8123)
    args = parser.parse_args(argv)
    cases = list(dict.fromkeys([*args.cases, *(["shared"] if args.shared else [])]))
    if args.gpu_shape and "adapter" in cases:
        raise SystemExit("--gpu-shape: no adapter case (its adapters are GGUF files for the offline default)")
    emit({"bench": "sessions", "machine": machine(), "args": {k: str(v) for k, v in vars(args).items()}})
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="mms-", dir="/tmp")  # short: Ray's socket paths
    try:
        run_layouts(args, cases)
    finally:
        shutil.rmtree(os.environ["RAY_TMPDIR"], ignore_errors=True)


def run_layouts(args: Any, cases: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base_file = decoder_models(Path(tmp), args.gpu_shape, args.tokenizer, args.slots or 16)
        base = yaml.safe_load(base_file.read_text())["models"][0]
        model = base["name"]
        for layout in args.layouts:
            kinds = ["text"] if layout == "scale" else list(dict.fromkeys(SERVER_KIND[c] for c in cases))
            for kind in kinds:
                directory = Path(tmp) / f"{layout}-{kind}"
                directory.mkdir()
                server = start(models_for(directory, base, layout, kind, args), layout, kind, args)
                try:
                    if layout == "scale":
                        emit(
                            {
                                "layout": layout,
                                "router": "prefix",
                                **asyncio.run(scale_run(server.base_url, model, args)),
                            }
                        )
                        continue
                    for case in (c for c in cases if SERVER_KIND[c] == kind):
                        before = counted(model)
                        result = asyncio.run(workload(server.base_url, model, args, case))
                        extra = {}
                        if case == "image":
                            health = httpx.get(server.base_url + "/health", timeout=30).json()
                            extra["captioner_ready"] = health["components"].get("captioner", {}).get("ready")
                        replicas, router = LAYOUTS[layout]
                        line = {"layout": layout, "replicas": replicas, "router": router, "case": case, **result}
                        extra["decoder_rss_mib"] = decoder_rss_mib()
                        emit({**line, **extra, **since(before, counted(model))})
                finally:
                    server.stop()

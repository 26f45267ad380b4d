"""Deploying onto a running cluster (docs/clusters.md, "Deploying onto a running cluster"), as an operator does it:
a `ray start --head` cluster of its own (a temp dir, free ports, one fake GPU, token auth), then the
Serve CLI against it: `serve deploy` of a config made from serve_config.yaml (its HTTP port changed,
`models_file` a models.yaml with the fake decoder), `serve status` until RUNNING, and a redeploy.

- Editing models.yaml alone changes nothing: Serve rebuilds an application only when its entry in the
  config changes (import_path, runtime_env, args). Bumping `revision` (an arg read by nothing) does.
- The rolling restart keeps every stream in flight: the old replicas take no new requests and
  finish theirs (graceful_shutdown_timeout_s: the request deadline, `options.for_replicas`). The
  streams outlast Serve's default of 20 s, which would cut them off. Requests sent during the
  rollout are answered, and those after it get the new `params.max_tokens`.
- Each replica's process has the builder's variables (`options.REPLICA_ENV`, read from
  /proc/<pid>/environ), and the application's runtime_env from the config too, its values winning.

Stopped with `serve shutdown` and by ending this cluster's own processes (`ray stop` would stop
every Ray on the machine).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml

from deployments.options import REPLICA_ENV
from tests.serve.conftest import ROOT, wait_until

BIN = Path(sys.executable).parent  # this venv's `ray` and `serve`
OLD_TOKENS, NEW_TOKENS = 4, 6  # params.max_tokens before and after the redeploy
TOKEN_DELAY_S = 0.1
STREAM_TOKENS = 300  # 30 s a stream: past Serve's default graceful_shutdown_timeout_s (20 s)
APP_ENV = {"MMSERVE_DEPLOY_TEST": "kept", "LRU_CACHE_CAPACITY": "8"}  # the config's runtime_env (8 wins over 16)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def models_yaml(max_tokens: int) -> dict[str, Any]:
    return {
        "server": {"request_timeout_s": 60},
        "models": [
            {
                "name": "echo",
                "engine": "fake",
                "params": {"max_tokens": max_tokens, "stream_interval_ms": 0},
                "fake": {"token_delay_ms": TOKEN_DELAY_S * 1000, "fill_to_max_tokens": True},
            }
        ],
    }


@dataclass
class Cluster:
    """`ray start --head --block` in a session of its own: every process of the cluster is under it."""

    directory: Path
    env: dict[str, str]
    dashboard: str
    http_port: int
    proc: subprocess.Popen[bytes]

    def cli(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / argv[0]), *argv[1:]], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def serve(self, *argv: str) -> str:
        done = self.cli("serve", *argv, "--address", self.dashboard)
        assert done.returncode == 0, f"serve {' '.join(argv)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def status(self) -> dict[str, Any]:
        applications: dict[str, Any] = yaml.safe_load(self.serve("status"))["applications"]
        return applications

    def processes(self) -> list[psutil.Process]:
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        return []

    def replica_pids(self, deployment: str) -> list[int]:
        """The live replica processes of a deployment (Ray titles them ray::ServeReplica:APP:NAME)."""
        pids = []
        for p in self.processes():
            with contextlib.suppress(psutil.Error):
                title = " ".join(p.cmdline())
                if p.status() != psutil.STATUS_ZOMBIE and "ServeReplica:" in title and f":{deployment}" in title:
                    pids.append(p.pid)
        return pids

    def stop(self) -> None:
        processes = self.processes()
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)  # `ray start --block` stops what it started
        _, alive = psutil.wait_procs(processes, timeout=20)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(alive, timeout=10)


def cluster_env() -> dict[str, str]:
    """A shell's environment with this checkout importable, no Ray settings of this process (its own
    ray.init sets some), and token auth with a token of the test's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), HF_HUB_OFFLINE="1")
    return env


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    directory = Path(tempfile.mkdtemp(prefix="mmray"))  # short: Ray's socket paths live under it
    env = cluster_env()
    dashboard_port = free_port()
    argv = [
        str(BIN / "ray"),
        "start",
        "--head",
        "--block",
        f"--port={free_port()}",
        f"--dashboard-port={dashboard_port}",
        f"--ray-client-server-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        "--num-cpus=4",
        "--num-gpus=1",
        f"--temp-dir={directory / 'ray'}",
        "--disable-usage-stats",
    ]
    log = (directory / "ray-start.log").open("wb")
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    running = Cluster(directory, env, f"http://127.0.0.1:{dashboard_port}", free_port(), proc)
    try:

        def dashboard_up() -> bool:
            assert proc.poll() is None, (directory / "ray-start.log").read_text()[-3000:]
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(running.dashboard, timeout=2).status_code < 500
            return False

        assert wait_until(dashboard_up, timeout_s=90), (directory / "ray-start.log").read_text()[-3000:]
        yield running
        running.serve("shutdown", "-y")
    finally:
        running.stop()
        log.close()
        shutil.rmtree(directory, ignore_errors=True)


def deploy_config(cluster: Cluster, models_file: Path, revision: int) -> Path:
    """serve_config.yaml with this cluster's HTTP port, the test's models.yaml, a runtime_env for the
    main application, and `revision`."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"]["port"] = cluster.http_port
    for application in config["applications"]:
        application["args"] = {**application["args"], "models_file": str(models_file), "revision": revision}
        if application["name"] == "default":
            application["runtime_env"] = {"env_vars": APP_ENV}
    path = cluster.directory / f"serve_config.{revision}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def settled(cluster: Cluster) -> dict[str, Any] | None:
    """Serve's applications when all are RUNNING with only RUNNING replicas (none stopping), else None."""
    applications = cluster.status()
    for name, application in applications.items():
        assert application["status"] != "DEPLOY_FAILED", (name, application)
        if application["status"] != "RUNNING":
            return None
        for deployment in application["deployments"].values():
            if set(deployment["replica_states"]) != {"RUNNING"}:
                return None
    return applications


def completion_tokens(client: httpx.Client) -> int:
    reply = client.post("/v1/chat/completions", json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["finish_reason"] == "length"
    return int(reply.json()["usage"]["completion_tokens"])


@dataclass
class Stream:
    """A streamed chat of STREAM_TOKENS tokens, read to its end in a thread."""

    url: str
    started: threading.Event = field(default_factory=threading.Event)
    status: int = 0
    tokens: int = 0  # the final usage's completion_tokens
    finish: str | None = None
    done: bool = False
    errors: list[str] = field(default_factory=list)

    def run(self) -> None:
        body = {
            "model": "echo",
            "stream": True,
            "max_tokens": STREAM_TOKENS,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hi"}],
        }
        try:
            with httpx.Client(timeout=120) as client, client.stream("POST", self.url, json=body) as response:
                self.status = response.status_code
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        self.done = True
                        continue
                    chunk = json.loads(line.removeprefix("data: "))
                    if "error" in chunk:
                        self.errors.append(json.dumps(chunk))
                        continue
                    for choice in chunk["choices"]:
                        self.finish = choice.get("finish_reason") or self.finish
                        if "tick" in (choice["delta"].get("content") or ""):
                            self.started.set()  # generating
                    if chunk.get("usage"):
                        self.tokens = chunk["usage"]["completion_tokens"]
        except httpx.HTTPError as exc:
            self.errors.append(repr(exc))
        finally:
            self.started.set()


def environ(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode(errors="replace").partition("=")[::2] for e in entries if e)


@pytest.mark.timeout(300)
def test_a_redeploy_rolls_out_a_changed_param_without_dropping_requests_in_flight(cluster, tmp_path):
    began = time.monotonic()
    models_file = tmp_path / "models.yaml"
    models_file.write_text(yaml.safe_dump(models_yaml(OLD_TOKENS)))
    cluster.serve("deploy", str(deploy_config(cluster, models_file, revision=1)))
    assert wait_until(lambda: settled(cluster) is not None, timeout_s=120, every_s=1), cluster.status()
    deployed = time.monotonic()
    client = httpx.Client(base_url=f"http://127.0.0.1:{cluster.http_port}", timeout=60)
    assert completion_tokens(client) == OLD_TOKENS

    # Only models.yaml edited: the same config deploys nothing new.
    models_file.write_text(yaml.safe_dump(models_yaml(NEW_TOKENS)))
    cluster.serve("deploy", str(deploy_config(cluster, models_file, revision=1)))
    assert {name: a["status"] for name, a in cluster.status().items()} == {"default": "RUNNING", "vision": "RUNNING"}
    assert completion_tokens(client) == OLD_TOKENS

    # Long streams in flight, then the revision bumped: a rolling restart of every replica.
    streams = [Stream(f"http://127.0.0.1:{cluster.http_port}/v1/chat/completions") for _ in range(3)]
    threads = [threading.Thread(target=s.run, daemon=True) for s in streams]
    for thread in threads:
        thread.start()
    for stream in streams:
        assert stream.started.wait(30) and not stream.errors, stream
    old_decoders = set(cluster.replica_pids("PrimaryDecoder"))
    redeployed = time.monotonic()
    cluster.serve("deploy", str(deploy_config(cluster, models_file, revision=2)))
    assert cluster.status()["default"]["status"] == "DEPLOYING"  # (the captioner stub may be done already)

    during: list[int] = []  # requests sent while the old replicas drain: each is answered
    while any(t.is_alive() for t in threads):
        during.append(completion_tokens(client))
        time.sleep(0.5)
    for thread in threads:
        thread.join()
    streamed = time.monotonic() - redeployed
    for stream in streams:
        assert (stream.status, stream.errors, stream.finish, stream.done) == (200, [], "length", True), stream
        assert stream.tokens == STREAM_TOKENS, stream
    assert set(during) <= {OLD_TOKENS, NEW_TOKENS} and NEW_TOKENS in during, during

    assert wait_until(lambda: settled(cluster) is not None, timeout_s=60, every_s=1), cluster.status()
    assert completion_tokens(client) == NEW_TOKENS

    # The new decoder replicas: the builder's variables, and the config's runtime_env over them.
    decoders = cluster.replica_pids("PrimaryDecoder")
    assert decoders and not set(decoders) & old_decoders, (decoders, old_decoders)
    expected = {**REPLICA_ENV["PrimaryDecoder"], **APP_ENV}
    for pid in decoders:
        env = environ(pid)
        assert {k: env.get(k) for k in expected} == expected, pid
        assert Path(f"/proc/{pid}/cwd").resolve() == ROOT  # where `ray start` ran: relative paths resolve there
    for pid in cluster.replica_pids("VisionCaptioner"):  # another application: no runtime_env of its own
        env = environ(pid)
        assert {k: env.get(k) for k in REPLICA_ENV["VisionCaptioner"]} == REPLICA_ENV["VisionCaptioner"]
        assert "MMSERVE_DEPLOY_TEST" not in env
    client.close()
    print(
        f"\ndeployed in {deployed - began:.1f}s; {len(streams)} streams of {STREAM_TOKENS} tokens finished "
        f"{streamed:.1f}s after the redeploy; {len(during)} requests answered during the rollout"
    )


def test_the_docs_show_the_commands_run_here():
    """The docs' section (docs/clusters.md) gives the commands this module runs (there on the default ports)."""
    page = (ROOT / "docs" / "clusters.md").read_text()
    section = page[page.index("\n## Deploying onto a running cluster\n") :]
    section = section[: section.index("\n## ", 1)]
    commands = {line.split("#")[0].strip() for line in section.splitlines() if line.startswith(("ray ", "serve "))}
    wanted = {"ray start --head", "serve deploy serve_config.yaml", "serve status", "serve shutdown -y", "ray stop"}
    assert commands == wanted, commands

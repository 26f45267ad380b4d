"""The documentation's commands, run as written, so that it cannot go stale: the README's and those of
every page under docs/. The service is started the README's way (`./scripts/run.sh`, on
serve_config.yaml's port), every other shell and Python block runs in order against it (the README
first, then the pages by path), then the stop command, after which nothing the service started may be
running.

A block is marked by an HTML comment on the line before it:
  <!-- readme-test: service -->         started in the background; its ready line is awaited (one in all)
  <!-- readme-test: stop -->            run last; the service and every process under it must be gone
  <!-- readme-test: skip (reason) -->   not run (a cluster, a GPU, root, long-running, this suite itself)
Every other ```bash block runs in `bash -euo pipefail`, every ```python block in .venv's Python, from
the repository root, in a new user's environment (no .venv on PATH, no Ray variables). Each must exit
0 and print something that is not an error.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import yaml

from scripts.bench.common import ray_env
from tests.serve.conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BLOCK = re.compile(
    r"^(?:<!-- readme-test: (?P<mark>[^>]*?) -->\n)?```(?P<lang>bash|python)\n(?P<code>.*?)^```$", re.M | re.S
)
READY = re.compile(
    r"^mmserve ready: (?P<url>http://\S+) \| model: \S+(, \S+)* "
    r"\| vision: (?P<vision>ok|off|(loading|degraded) \(.+\))$"
)
BLOCK_TIMEOUT_S = 180  # a hang guard, not a measurement
VISION = re.compile(r"^mmserve vision: (ok|degraded \(.+\))$")
# What a new user must not find in the terminal of a working offline start, its examples and its stop
# (docs/running.md names the WARNING lines that are expected): a traceback, an ERROR line, Ray's stack dump on
# SIGTERM, an asyncio task nobody awaited, Serve's slow-start warning (but for the captioner's replica,
# which waits in its constructor for weights that offline never come: docs/running.md names that line).
ALARM = re.compile(
    r"Traceback|\bERROR\b|SIGTERM received|never retrieved"
    r"|(?<!'VisionCaptioner' in application 'vision' has 1 replicas that have )taken more than \d+s to initialize"
)
READY_TIMEOUT_S = 300


@dataclass
class Block:
    source: str  # the file, relative to the repository root
    lang: str
    code: str
    mark: str  # "", "service", "stop" or "skip (reason)"


def doc_files() -> list[Path]:
    """README.md, then every page under docs/ (the site's pages and the run records), by path."""
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def doc_blocks() -> list[Block]:
    return [
        Block(str(path.relative_to(ROOT)), m["lang"], m["code"], m["mark"] or "")
        for path in doc_files()
        for m in BLOCK.finditer(path.read_text())
    ]


def user_env() -> dict[str, str]:
    """The environment of a new user's shell: this interpreter's venv neither active nor on PATH, no
    Ray settings (the suite's own ray.init sets RAY_AUTH_MODE in this process)."""
    venv_bins = {str(Path(sys.executable).parent), str(ROOT / ".venv" / "bin")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "VIRTUAL_ENV"}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p not in venv_bins)
    return env


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def run_block(block: Block, env: dict[str, str]) -> str:
    if block.lang == "bash":
        argv = ["bash", "-euo", "pipefail", "-c", block.code]
    else:
        argv = [str(ROOT / ".venv" / "bin" / "python"), "-c", block.code]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    shown = (
        f"{block.source} block:\n{block.code}\nexit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    )
    assert done.returncode == 0, shown
    assert done.stdout.strip(), shown
    try:
        body = json.loads(done.stdout)
    except ValueError:
        body = None
    assert not (isinstance(body, dict) and isinstance(body.get("error"), dict)), shown  # a response has error: null
    return done.stdout


class Service:
    """The README's service command in the background, its output collected line by line."""

    def __init__(self, block: Block, env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self._ready = threading.Event()
        # As `./scripts/run.sh &` in a script starts it: SIGINT ignored (stop.sh must stop it all the same).
        self.proc = subprocess.Popen(
            ["bash", "-c", "trap '' INT; exec bash -euo pipefail -c \"$0\"", block.code],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if READY.match(self.lines[-1]):
                self._ready.set()
        self._ready.set()  # the output ended: the service exited

    def wait_ready(self) -> re.Match[str]:
        self._ready.wait(READY_TIMEOUT_S)
        ready = [m for m in map(READY.match, self.lines) if m]
        assert ready, "no ready line; the service's last output:\n" + "\n".join(self.lines[-60:])
        return ready[0]

    def tree(self) -> list[psutil.Process]:
        """The service and every process under it (serve run, Ray's processes, the replicas)."""
        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]

    def kill(self) -> None:
        """Last resort after a failure: nothing of it may outlive the test."""
        tree: list[psutil.Process] = []
        with contextlib.suppress(psutil.NoSuchProcess):
            tree = self.tree()
        for p in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


def command_line(process: psutil.Process) -> str:
    """A process's command line; empty for one gone or a zombie (a replica that failed to start)."""
    with contextlib.suppress(psutil.Error):
        return " ".join(process.cmdline())
    return ""


def still_running(processes: list[psutil.Process]) -> list[str]:
    left = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            pass
    return left


def test_readme_marks_are_known():
    blocks = doc_blocks()
    marks = [b.mark for b in blocks]
    assert marks.count("service") == 1 and marks.count("stop") == 1, marks
    for block in blocks:
        assert block.mark in ("", "service", "stop") or re.fullmatch(r"skip \(.+\)", block.mark), block
    assert {b.source for b in blocks if b.mark in ("service", "stop")} == {"README.md"}
    assert any(b.lang == "python" and not b.mark for b in blocks)
    assert {b.source for b in blocks} > {"README.md"}, "no block collected from the docs pages"


@pytest.mark.timeout(900)
def test_readme_commands_run_as_written():
    blocks = doc_blocks()
    [start] = [b for b in blocks if b.mark == "service"]
    [stop] = [b for b in blocks if b.mark == "stop"]
    port = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["http_options"]["port"]
    assert not port_in_use(port), f"port {port} is taken: stop what serves there (scripts/stop.sh) first"

    env = user_env()
    service = Service(start, env)
    try:
        ready = service.wait_ready()
        assert ready["url"] == f"http://127.0.0.1:{port}"
        for block in blocks:
            if not block.mark:
                run_block(block, env)
        if ready["vision"].startswith("loading"):  # then one more line says how the captioner's start ended
            assert wait_until(lambda: any(map(VISION.match, service.lines)), 120, 1), service.lines[-30:]
        processes = service.tree()
        assert len(processes) > 3, [command_line(p) for p in processes]  # serve run and Ray's processes
        # run.sh's Ray settings (scripts/ray_env.sh) reach Serve's controller, which reads them at its start.
        [controller] = [p for p in processes if "ServeController" in command_line(p)]
        assert ray_env(env).items() <= controller.environ().items()
        run_block(stop, env)
        service.proc.wait(BLOCK_TIMEOUT_S)  # run.sh itself has exited
        assert still_running(processes) == []
        assert not port_in_use(port)
        assert sum(bool(READY.match(line)) for line in service.lines) == 1
        # Stopped the graceful way (Serve shuts its applications down), not killed.
        assert any("Got KeyboardInterrupt, shutting down" in line for line in service.lines), service.lines[-30:]
        alarms = [line for line in service.lines if ALARM.search(line)]
        assert alarms == [], "\n".join(alarms[:40])
    finally:
        if service.proc.poll() is None:
            service.kill()

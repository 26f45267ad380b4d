"""On a CPU-only placement the builder starts its fixed set of decoder replicas (options.decoder_layout),
requests are answered across them, and each replica's process has the builder's environment."""

import contextlib
from pathlib import Path

import psutil
import pytest
from ray import serve

from deployments.app import build_app
from deployments.config import cpu_cores
from deployments.engines.registry import CPU_DECODERS
from deployments.options import REPLICA_ENV
from tests.serve.conftest import undeploy, write_models


@pytest.fixture(scope="module")
def cpu_app(serve_cluster, tmp_path_factory):
    models = write_models(tmp_path_factory.mktemp("cpu"), [{"name": "echo", "engine": "fake"}])
    serve.run(build_app({"models_file": str(models), "decoder_gpus": 0}), name="cpu", route_prefix="/cpu")
    yield
    undeploy("cpu")


def test_cpu_decoders_run_side_by_side(cpu_app, http):
    decoder = serve.status().applications["cpu"].deployments["PrimaryDecoder"]
    assert decoder.replica_states == {"RUNNING": min(CPU_DECODERS, cpu_cores())}
    for word in ("one", "two", "three", "four"):
        body = {"model": "echo", "messages": [{"role": "user", "content": word}]}
        reply = http.post("/cpu/v1/chat/completions", json=body)
        assert reply.json()["choices"][0]["message"]["content"] == f"user: {word}"


def test_decoder_replicas_started_without_a_config_have_the_builders_environment(cpu_app):
    """`serve run deployments.app:build_app` (here `serve.run` of the builder, no runtime_env): each
    decoder replica's process still has `REPLICA_ENV` (GOMP_SPINCOUNT: a 2-core machine was 4x slower
    without it), as its /proc/<pid>/environ shows."""
    replicas = []  # Ray titles a replica's process ray::ServeReplica:APP:DEPLOYMENT; this cluster is ours
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "ServeReplica:cpu:PrimaryDecoder" in " ".join(process.cmdline()):
                replicas.append(process.pid)
    assert len(replicas) == min(CPU_DECODERS, cpu_cores()), replicas
    for pid in replicas:
        entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        env = dict(e.decode(errors="replace").partition("=")[::2] for e in entries if e)
        assert {k: env.get(k) for k in REPLICA_ENV["PrimaryDecoder"]} == REPLICA_ENV["PrimaryDecoder"], pid

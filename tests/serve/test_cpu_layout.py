"""On a CPU-only placement the builder starts its fixed set of decoder replicas (options.decoder_layout),
requests are answered across them, each replica's process has the builder's environment, and the
decoder's request router (`routing.PrefixRouter`, `request_router_config`) keeps each session's turns
on the replica that answered its first."""

import contextlib
import re
from pathlib import Path

import psutil
import pytest
import ray
from ray import serve

from deployments.app import build_app
from deployments.config import cpu_cores
from deployments.engines.registry import CPU_DECODERS
from deployments.options import REPLICA_ENV
from tests.serve.conftest import metric_total, scrape_metrics, settled_metrics, undeploy, wait_until, write_models


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


SESSIONS, TURNS = 2, 5


def answering_replica(request_id: str) -> str:
    """The decoder replica that served a request: the one whose Serve log has its request id."""
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs" / "serve"
    found: list[str] = []

    def logged() -> bool:
        found[:] = [
            m[1]
            for path in logs.glob("replica_cpu_PrimaryDecoder_*.log")
            if request_id in path.read_text(errors="replace")
            and (m := re.match(r"replica_cpu_PrimaryDecoder_(\w+)\.log", path.name))
        ]
        return bool(found)

    assert wait_until(logged, timeout_s=30), request_id
    assert len(found) == 1, found
    return found[0]


def test_each_sessions_turns_stay_on_the_replica_that_holds_its_prefix(cpu_app, http):
    """Two sessions, their turns interleaved, each resending its whole conversation (no session hint):
    every turn lands on the decoder replica that answered the session's first (Serve's replica log
    names each request id), and the router counts the later turns warm. With Serve's default router
    (no `request_router_config`) both replicas are idle and equal, so each turn is a coin toss: this
    fails but for 1 run in 4 ** (TURNS - 1)."""
    if min(CPU_DECODERS, cpu_cores()) < 2:
        pytest.skip("one decoder replica: nothing to choose")
    warm = metric_total(scrape_metrics("echo"), "routing_decisions", decision="warm")
    conversations = [
        [{"role": "system", "content": f"Session {s} notes: " + " ".join(f"w{s}x{i}" for i in range(200))}]
        for s in range(SESSIONS)
    ]
    replicas: list[set[str]] = [set() for _ in range(SESSIONS)]
    for turn in range(TURNS):
        for session, messages in enumerate(conversations):
            messages.append({"role": "user", "content": f"turn {turn}"})
            body = {"model": "echo", "messages": messages, "max_tokens": 4}
            reply = http.post("/cpu/v1/chat/completions", json=body)
            assert reply.status_code == 200, reply.text
            messages.append({"role": "assistant", "content": reply.json()["choices"][0]["message"]["content"]})
            replicas[session].add(answering_replica(reply.headers["x-request-id"]))
    assert all(len(held) == 1 for held in replicas), replicas
    later = SESSIONS * (TURNS - 1)
    samples = settled_metrics(
        ("echo",), lambda s: metric_total(s, "routing_decisions", decision="warm") >= warm + later
    )
    assert metric_total(samples, "routing_decisions", decision="warm") >= warm + later

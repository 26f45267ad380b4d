"""Real Ray Serve on the CPU: a local cluster with one fake GPU (so GPU pinning and packing are
exercised), HTTP on a test port, and helpers to deploy the two applications from a models.yaml.
Replicas import only the installed package: fakes are the shipped `engine: fake`."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import ray
import yaml
from ray import serve

from deployments.app import build_app, build_captioner_app

ROOT = Path(__file__).resolve().parents[2]
PORT = int(os.environ.get("MMSERVE_TEST_PORT", "8731"))  # another port where another suite runs beside
BASE_URL = f"http://127.0.0.1:{PORT}"


def start_local_cluster() -> None:
    """The session's Ray: this machine as one node with 8 CPUs and one fake GPU, Serve on PORT.
    (test_cluster.py stops it for its own multi-node cluster and calls this to start it again.)
    address="local": a new cluster even where /tmp/ray/ray_current_cluster names another (a `ray
    start` or a test's cluster left it), which ray.init() would join, refusing num_cpus and num_gpus."""
    ray.init(address="local", num_cpus=8, num_gpus=1, include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})


@pytest.fixture(scope="session")
def serve_cluster():
    start_local_cluster()
    yield
    serve.shutdown()
    ray.shutdown()


def write_models(directory: Path, models: list[dict[str, Any]], **file_level: Any) -> Path:
    path = directory / "models.yaml"
    path.write_text(yaml.safe_dump({**file_level, "models": models}))
    return path


def echo_with_captioner(captioner_path: Path | None, max_tokens: int = 4096, **captioning: Any) -> list[dict[str, Any]]:
    """models.yaml entries: the fake decoder (answers with its prompt) and a captioner `cap` with
    these `captioning` settings: the model at `captioner_path`, or the fake one."""
    captioner = {"local_path": str(captioner_path)} if captioner_path is not None else {"engine": "fake"}
    return [
        {
            "name": "echo",
            "engine": "fake",
            "params": {"max_tokens": max_tokens},
            "capabilities": {"vision_mode": "proxy", "captioner": "cap"},
        },
        {"name": "cap", **captioner, "captioning": captioning},
    ]


def deploy(models_file: Path, *, wait_for_captioner: bool = True, main: str = "default", route: str = "/", **args):
    """Deploy the captioner application and the main application, as serve_config.yaml does."""
    args = {"models_file": str(models_file), **args}
    serve._run(build_captioner_app(args), name="vision", route_prefix=None, _blocking=wait_for_captioner)
    serve.run(build_app(args), name=main, route_prefix=route)


def undeploy(*names: str) -> None:
    for name in names:
        serve.delete(name)


def app_status(name: str) -> str:
    status = serve.status().applications[name].status
    return getattr(status, "value", str(status))


def kill_replicas(deployment: str) -> None:
    """Kill every replica actor of a deployment, as a crash would; Serve's controller replaces them."""
    replicas = [a for a in ray.util.list_named_actors(all_namespaces=True) if f"#{deployment}#" in a["name"]]
    assert replicas, f"no {deployment} replica"
    for actor in replicas:
        ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)


def ingress_log_lines(containing: str) -> list[str]:
    """Lines of the Ingress replicas' Serve log files that contain `containing`."""
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs" / "serve"
    return [
        line
        for path in logs.glob("replica_*_Ingress_*.log")
        for line in path.read_text(errors="replace").splitlines()
        if containing in line
    ]


def wait_until(predicate: Callable[[], bool], timeout_s: float = 90.0, every_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every_s)
    return False


@pytest.fixture
def http() -> httpx.Client:
    with httpx.Client(base_url=BASE_URL, timeout=120) as client:
        yield client


def image_chat(model: str, url: str, text: str = "What is in this picture?") -> dict[str, Any]:
    return {
        "model": model,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}],
            }
        ],
        "temperature": 0,
    }

"""Real Ray Serve on the CPU: a local cluster with one fake GPU (so GPU pinning and packing are
exercised), HTTP on a test port, and helpers to deploy the two applications from a models.yaml.
Replicas import only the installed package: fakes are the shipped `engine: fake`."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import ray
import yaml
from prometheus_client.parser import text_string_to_metric_families
from ray import serve

from deployments.app import build_app, build_captioner_app
from deployments.monitoring import load_board
from deployments.monitoring.metrics import SPECS

ROOT = Path(__file__).resolve().parents[2]
PORT = int(os.environ.get("MMSERVE_TEST_PORT", "8731"))  # another port where another suite runs beside
BASE_URL = f"http://127.0.0.1:{PORT}"
EXPORTED = {spec.name: spec.exported for spec in SPECS}  # a metric's name in Prometheus' text format


def start_local_cluster() -> None:
    """The session's Ray: this machine as one node with 8 CPUs and one fake GPU, Serve on PORT.
    (test_cluster.py stops it for its own multi-node cluster and calls this to start it again.)
    address="local": a new cluster even where /tmp/ray/ray_current_cluster names another (a `ray
    start` or a test's cluster left it), which ray.init() would join, refusing num_cpus and num_gpus."""
    ray.init(address="local", num_cpus=8, num_gpus=1, include_dashboard=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})


@pytest.fixture(scope="session")
def serve_cluster(tmp_path_factory):
    # The default storage root (stored responses, conversations, files) in this session's own folder,
    # for every Ray worker (they inherit the environment Ray starts with), never the user's.
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("xdg-state"))
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
    """Deploy the captioner application and the main application, as serve_config.yaml does;
    `wait_for_captioner`: first wait until the captioner has settled (`captioner_settled`)."""
    args = {"models_file": str(models_file), **args}
    serve._run(build_captioner_app(args), name="vision", route_prefix=None, _blocking=False)
    if wait_for_captioner:
        assert wait_until(lambda: captioner_settled("vision"), timeout_s=300), serve.status().applications.get("vision")
    serve.run(build_app(args), name=main, route_prefix=route)


def captioner_settled(app: str) -> bool:
    """The captioner application is RUNNING (its models loaded), or a replica of it waits for a model
    that failed to load and said so on the load board (it is not RUNNING until the model loads)."""
    application = serve.status().applications.get(app)
    if application is None or not application.deployments:
        return False
    if getattr(application.status, "value", application.status) in ("RUNNING", "DEPLOY_FAILED"):
        return True
    return any(load_board.read(app, name) is not None for name in application.deployments)


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


def replica_log_lines(deployment: str, containing: str, app: str = "*") -> list[str]:
    """Lines of the Serve log files of `deployment`'s replicas (of application `app`) that contain
    `containing`."""
    logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs" / "serve"
    return [
        line
        for path in logs.glob(f"replica_{app}_{deployment}_*.log")
        for line in path.read_text(errors="replace").splitlines()
        if containing in line
    ]


def ingress_log_lines(containing: str) -> list[str]:
    """Lines of the Ingress replicas' Serve log files that contain `containing`."""
    return replica_log_lines("Ingress", containing)


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape_metrics(*models: str) -> Samples:
    """Every sample of Ray's metrics export on this node (the endpoint the Ray dashboard's Prometheus
    scrapes) whose `model` label is one of `models`, by exported name and labels."""
    port = ray.nodes()[0]["MetricsExportPort"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("model") in models
    }


def settled_metrics(models: tuple[str, ...], expected: Callable[[Samples], bool], timeout_s: float = 60.0) -> Samples:
    """The metrics of `models` once `expected` holds of them (Ray exports every few seconds), so that
    the exact comparisons that follow are fair; the last scrape when it never does."""
    samples: Samples = {}

    def reached() -> bool:
        nonlocal samples
        samples = scrape_metrics(*models)
        return expected(samples)

    wait_until(reached, timeout_s=timeout_s, every_s=1.0)
    return samples


def metric_total(samples: Samples, name: str, suffix: str = "", **labels: str) -> float:
    """The sum over replicas of one metric's samples (`name`: its name in `SPECS`; `suffix`: e.g. a
    histogram's `_count`) with these labels."""
    wanted = EXPORTED[name] + suffix
    return sum(v for (n, tags), v in samples.items() if n == wanted and set(labels.items()) <= tags)


def wait_until(predicate: Callable[[], bool], timeout_s: float = 90.0, every_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every_s)
    return False


def decoder_details() -> dict[str, Any]:
    """The details of /health's decoder component."""
    return httpx.get(f"{BASE_URL}/health", timeout=30).json()["components"]["decoder"]["details"]


def decoder_sequences() -> tuple[int, int] | None:
    """The decoder's (running, waiting) sequences on /health: (0, 0) while its model is unloaded,
    None when /health could not ask the replica (`busy`: Serve's view instead)."""
    details = decoder_details()
    if details.get("state") == "unloaded":
        return 0, 0
    return (details["running"], details["waiting"]) if "running" in details else None


@contextlib.contextmanager
def open_streams(bodies: list[dict[str, Any]], started: int) -> Iterator[None]:
    """Streamed chat requests, all at once, each on its own connection. The block runs once `started`
    of them have sent their first event; leaving it closes them all (a stream that failed fails the
    test), after which the decoder must show nothing running or waiting."""
    stop, first_events = threading.Event(), set()

    def one(i: int) -> None:
        with httpx.stream("POST", f"{BASE_URL}/v1/chat/completions", json=bodies[i], timeout=120) as response:
            assert response.status_code == 200, response.read()
            for _ in response.iter_lines():
                first_events.add(i)
                if stop.is_set():
                    return

    with ThreadPoolExecutor(len(bodies)) as pool:
        futures = [pool.submit(one, i) for i in range(len(bodies))]
        try:
            assert wait_until(lambda: len(first_events) >= started, 60), f"{len(first_events)} streams started"
            yield
        finally:
            stop.set()
            for future in futures:
                future.result(timeout=120)
    assert wait_until(lambda: decoder_sequences() == (0, 0), 15), decoder_sequences()


def replica_pids(app: str, deployment: str) -> list[int]:
    """Processes of a deployment's replicas (Ray titles them ray::ServeReplica:APP:DEPLOYMENT)."""
    pids = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if f"ServeReplica:{app}:{deployment}" in " ".join(process.cmdline()):
                pids.append(process.pid)
    return pids


def gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped by its parent has)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


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

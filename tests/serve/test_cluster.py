"""Placement on a simulated multi-node cluster (`ray.cluster_utils.Cluster`, all on this machine).

A CPU head labelled ``node-kind=cpu`` and worker nodes with one fake GPU and two CPUs each, deployed
from the shipped serve_config.yaml (`proxy_location: EveryNode`) with one override, the operator's
way of keeping the ingress off GPU nodes: the Ingress's ``ray_actor_options`` with a
``label_selector`` for that label. Replica placement is read from Serve's controller (the node id of
every replica and proxy, as `serve status` and the dashboard show them). Each worker node's proxy
listens on its own port (Ray's ``RAY_SERVE_WORKER_PROXY_HTTP_PORT``, as Ray's own proxy tests do on
one machine), so a request can be sent through each node's proxy.

- 1 GPU per model: decoder and captioner on two GPU nodes, the ingress on the head; a proxy on
  every node that runs replicas answers. The captioner's node removed: text keeps answering, image
  requests degrade (no GPU is left for the captioner) until a GPU node joins; then the captioner
  runs there and images are captioned again.
- 0.5 GPU per model: Serve's default scheduler still spreads the two over both GPU nodes. The
  captioner's node removed, the captioner moves onto the decoder's node (both on its one GPU) while
  text keeps answering; images degrade, then are captioned again. Then, with a new GPU node, the
  decoder's node removed: both move to the new node and the service answers again.
- 0.5 GPU per model under ``RAY_SERVE_USE_PACK_SCHEDULING_STRATEGY=1`` (set in the head's
  environment, where Serve's controller runs): both on one GPU node from the start.

The module runs its own Ray cluster: it stops the session's local cluster (`serve_cluster`) if it
is up and starts it again afterwards, so the other Serve tests of the session run before or after.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import ray
import yaml
from ray import serve
from ray._private.node import Node
from ray.cluster_utils import Cluster
from ray.serve._private.api import serve_start
from ray.serve._private.client import ServeControllerClient
from ray.serve.schema import ServeDeploySchema, ServeInstanceDetails

from tests.conftest import data_url, png_bytes
from tests.serve.conftest import ROOT, echo_with_captioner, image_chat, start_local_cluster, wait_until, write_models

CPU_LABEL = {"node-kind": "cpu"}
# The override of serve_config.yaml that keeps the ingress on CPU nodes (it replaces the builder's
# ray_actor_options whole, so it repeats num_cpus: 0).
INGRESS_ON_CPU_NODES = {
    "name": "Ingress",
    "ray_actor_options": {
        "num_cpus": 0,
        "label_selector": CPU_LABEL,
        "runtime_env": {"env_vars": {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}},  # the builder's, kept
    },
}
# The batch runner (/v1/batches) kept on CPU nodes the same way: it needs no GPU, and a GPU node's
# loss should not stop the batches.
RUNNER_ON_CPU_NODES = {"name": "BatchRunner", "ray_actor_options": {"num_cpus": 0, "label_selector": CPU_LABEL}}
TEXT = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class SimulatedCluster:
    """The head (CPU only, labelled) and GPU worker nodes; `ports`: node id -> its proxy's port."""

    pack: bool
    cluster: Cluster
    head: str
    ports: dict[str, int]
    nodes: dict[str, Node] = field(default_factory=dict)

    @classmethod
    def start(cls, *, pack: bool) -> SimulatedCluster:
        head_port = free_port()
        env = {"RAY_SERVE_USE_PACK_SCHEDULING_STRATEGY": "1"} if pack else {}
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 1, "labels": CPU_LABEL, "include_dashboard": False, "env_vars": env},
        )
        head = cluster.head_node
        assert head is not None
        sim = cls(pack, cluster, head.node_id, {head.node_id: head_port})
        try:
            for _ in range(2):
                sim.add_gpu_node()
            ray.init(address=cluster.address)
            serve_start(proxy_location="EveryNode", http_options={"host": "127.0.0.1", "port": head_port})
        except BaseException:
            sim.stop()
            raise
        return sim

    @property
    def client(self) -> ServeControllerClient:
        return serve_start()

    def add_gpu_node(self) -> str:
        port = free_port()
        proxy_port = {"RAY_SERVE_WORKER_PROXY_HTTP_PORT": str(port)}
        node = self.cluster.add_node(num_cpus=2, num_gpus=1, env_vars=proxy_port)
        self.ports[node.node_id] = port
        self.nodes[node.node_id] = node
        return str(node.node_id)

    def remove_node(self, node_id: str) -> None:
        self.cluster.remove_node(self.nodes.pop(node_id))
        del self.ports[node_id]

    def reset(self) -> None:
        """No applications, and two GPU nodes."""
        for app in ("default", "vision"):
            serve.delete(app)
        while len(self.nodes) < 2:
            self.add_gpu_node()

    def stop(self) -> None:
        try:
            if ray.is_initialized():
                serve.shutdown()
        finally:
            ray.shutdown()
            self.cluster.shutdown()

    def url(self, node_id: str) -> str:
        return f"http://127.0.0.1:{self.ports[node_id]}"

    def deploy(self, models: Path, gpus: float) -> None:
        """serve_config.yaml as shipped, with this cluster's port, these models, `gpus` per model
        and the ingress and the batch runner kept on CPU nodes; returns when both applications run."""
        config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
        assert config["proxy_location"] == "EveryNode"
        config["http_options"]["port"] = self.ports[self.head]
        for app in config["applications"]:
            app["args"] = {**app["args"], "models_file": str(models), "decoder_gpus": gpus, "captioner_gpus": gpus}
            if app["name"] == "default":
                app["deployments"] = [INGRESS_ON_CPU_NODES, RUNNER_ON_CPU_NODES]
        self.client.deploy_apps(ServeDeploySchema.model_validate(config))
        deployments = {"Ingress", "BatchRunner", "PrimaryDecoder", "VisionCaptioner"}
        assert wait_until(lambda: self.placement().keys() == deployments)

    def details(self) -> ServeInstanceDetails:
        return ServeInstanceDetails(**self.client.get_serve_details())

    def placement(self) -> dict[str, list[str]]:
        """Deployment -> node ids of its RUNNING replicas, once every application is RUNNING."""
        details = self.details()
        if any(str(app.status.value) != "RUNNING" for app in details.applications.values()):
            return {}
        return {
            name: sorted(str(r.node_id) for r in deployment.replicas if r.state.value == "RUNNING")
            for app in details.applications.values()
            for name, deployment in app.deployments.items()
        }

    def replicas(self, deployment: str) -> list[tuple[str, str | None]]:
        """(state, node id) of each of the deployment's replicas, whatever its application's status."""
        return sorted(
            (str(r.state.value), r.node_id)
            for app in self.details().applications.values()
            for name, d in app.deployments.items()
            if name == deployment
            for r in d.replicas
        )

    def proxies(self) -> dict[str, str]:
        return {node: str(proxy.status.value) for node, proxy in self.details().proxies.items()}


@pytest.fixture(scope="module")
def clusters() -> Iterator[dict[bool, SimulatedCluster]]:
    """At most one simulated cluster at a time, by `pack`; the session's cluster is stopped first
    and started again at the end if it was up."""
    session_was_up = ray.is_initialized()
    if session_was_up:
        serve.shutdown()
        ray.shutdown()
    holder: dict[bool, SimulatedCluster] = {}
    try:
        yield holder
    finally:
        try:
            for sim in holder.values():
                sim.stop()
        finally:
            if session_was_up:
                start_local_cluster()


def simulated(clusters: dict[bool, SimulatedCluster], *, pack: bool) -> SimulatedCluster:
    if pack in clusters:
        clusters[pack].reset()
        return clusters[pack]
    for other in list(clusters):
        clusters.pop(other).stop()
    clusters[pack] = SimulatedCluster.start(pack=pack)
    return clusters[pack]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """The fake decoder and captioner; no caption cache (every image goes to the captioner), short
    captioner deadline and failure memory."""
    return write_models(
        tmp_path_factory.mktemp("cluster"),
        echo_with_captioner(None),
        proxy_vision={"timeout_s": 10, "retry_after_s": 0.5, "cache_entries": 0},
    )


def image_answer(url: str, shade: int = 0) -> httpx.Response:
    body = image_chat("echo", data_url(png_bytes((255, shade % 256, 0))))
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)


def captioned(response: httpx.Response) -> bool:
    if response.status_code != 200 or "x-vision-degraded" in response.headers:
        return False
    return "Image 1: " in response.json()["choices"][0]["message"]["content"]


def degraded(response: httpx.Response) -> bool:
    return (
        response.status_code == 200
        and response.headers.get("x-vision-degraded") == "captioner-unavailable"
        and response.json()["vision"]["degraded"] is True
    )


@dataclass
class TextTraffic:
    """Text requests through the head's proxy, back to back, in a thread: their status codes."""

    url: str
    statuses: list[int] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> TextTraffic:
        self._thread = threading.Thread(target=self._send, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _send(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set():
                try:
                    self.statuses.append(client.post("/v1/chat/completions", json=TEXT).status_code)
                except httpx.HTTPError:
                    self.statuses.append(0)
                time.sleep(0.1)


def assert_ingress_on_head(sim: SimulatedCluster, placement: dict[str, list[str]]) -> None:
    assert placement["Ingress"] == placement["BatchRunner"] == [sim.head]


def assert_every_proxy_answers(sim: SimulatedCluster, placement: dict[str, list[str]]) -> None:
    """A proxy on the head and on each node with a replica, HEALTHY, and a request through each one
    (its own port) answered: text, and an image captioned."""
    replica_nodes = {node for nodes in placement.values() for node in nodes}
    assert wait_until(lambda: sim.proxies() == dict.fromkeys(replica_nodes | {sim.head}, "HEALTHY")), sim.proxies()
    for node in replica_nodes | {sim.head}:
        text = httpx.post(f"{sim.url(node)}/v1/chat/completions", json=TEXT, timeout=60)
        assert text.status_code == 200, (node, text.text)
        assert text.json()["choices"][0]["message"]["content"] == "user: hi"
        image = image_answer(sim.url(node))
        assert captioned(image), (node, image.headers, image.text)


def test_one_gpu_each_spreads_over_two_nodes_and_survives_losing_the_captioners(clusters, models):
    sim = simulated(clusters, pack=False)
    sim.deploy(models, gpus=1)
    placement = sim.placement()
    gpu_nodes = set(sim.nodes)
    [decoder], [captioner] = placement["PrimaryDecoder"], placement["VisionCaptioner"]
    assert_ingress_on_head(sim, placement)
    assert {decoder, captioner} == gpu_nodes
    assert_every_proxy_answers(sim, placement)

    head = sim.url(sim.head)
    with TextTraffic(head) as text:
        sim.remove_node(captioner)
        # The decoder's node has no GPU left for a captioner: image requests degrade, text answers.
        assert wait_until(lambda: degraded(image_answer(head)), timeout_s=60)
        # Its replacement cannot be placed: STARTING, on no node.
        assert wait_until(lambda: sim.replicas("VisionCaptioner") == [("STARTING", None)], timeout_s=30)
        for shade in range(3):
            assert degraded(image_answer(head, shade))
        assert sim.replicas("PrimaryDecoder") == [("RUNNING", decoder)]
        assert sim.replicas("VisionCaptioner") == [("STARTING", None)]

        newcomer = sim.add_gpu_node()
        assert wait_until(lambda: captioned(image_answer(head)), timeout_s=90)
    assert text.statuses and set(text.statuses) == {200}, text.statuses

    placement = sim.placement()
    assert placement["VisionCaptioner"] == [newcomer]
    assert placement["PrimaryDecoder"] == [decoder]
    assert_ingress_on_head(sim, placement)
    assert_every_proxy_answers(sim, placement)


def test_half_a_gpu_each_spreads_and_moves_onto_the_gpu_left_when_a_node_goes(clusters, models):
    sim = simulated(clusters, pack=False)
    sim.deploy(models, gpus=0.5)
    placement = sim.placement()
    [decoder], [captioner] = placement["PrimaryDecoder"], placement["VisionCaptioner"]
    assert_ingress_on_head(sim, placement)
    # Serve's default scheduler spreads replicas, even where both would fit on one GPU.
    assert {decoder, captioner} == set(sim.nodes)
    assert_every_proxy_answers(sim, placement)

    head = sim.url(sim.head)
    answers: list[httpx.Response] = []
    with TextTraffic(head) as text:
        sim.remove_node(captioner)

        def captioned_again() -> bool:
            answers.append(image_answer(head, len(answers)))
            return captioned(answers[-1])

        assert wait_until(captioned_again, timeout_s=90)
    assert text.statuses and set(text.statuses) == {200}, text.statuses
    # Degraded while the captioner moved (the first request found it gone), then captioned.
    assert degraded(answers[0]) and all(captioned(a) or degraded(a) for a in answers), [a.text for a in answers]

    placement = sim.placement()
    assert placement["VisionCaptioner"] == placement["PrimaryDecoder"] == [decoder]  # one node, one GPU
    assert_ingress_on_head(sim, placement)
    assert_every_proxy_answers(sim, placement)

    # The decoder's node goes too, once another GPU node has joined: both move there.
    newcomer = sim.add_gpu_node()
    with TextTraffic(head) as text:
        sim.remove_node(decoder)
        assert wait_until(lambda: sim.placement().get("PrimaryDecoder") == [newcomer], timeout_s=90)
        assert wait_until(lambda: text.statuses[-3:] == [200] * 3, timeout_s=60)
    # A request in flight on the lost decoder may end with a 503 (as any decoder fault); the others
    # waited for the new replica.
    assert set(text.statuses) <= {200, 503}, text.statuses
    assert wait_until(lambda: captioned(image_answer(head)), timeout_s=60)
    placement = sim.placement()
    assert placement["VisionCaptioner"] == placement["PrimaryDecoder"] == [newcomer]


def test_half_a_gpu_each_packs_on_one_node_with_serves_pack_scheduling(clusters, models):
    sim = simulated(clusters, pack=True)
    sim.deploy(models, gpus=0.5)
    placement = sim.placement()
    assert_ingress_on_head(sim, placement)
    [decoder] = placement["PrimaryDecoder"]
    assert placement["VisionCaptioner"] == [decoder]
    assert decoder in sim.nodes
    # The other GPU node runs nothing, so Serve starts no proxy there.
    assert_every_proxy_answers(sim, placement)
    assert set(sim.proxies()) == {sim.head, decoder}

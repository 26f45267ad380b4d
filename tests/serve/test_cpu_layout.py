"""On a CPU-only placement the builder starts its fixed set of decoder replicas (options.decoder_layout),
and requests are answered across them."""

import pytest
from ray import serve

from deployments.app import build_app
from deployments.config import cpu_cores
from deployments.options import CPU_DECODERS
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

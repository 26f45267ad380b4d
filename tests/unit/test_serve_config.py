"""serve_config.yaml is a valid Serve config whose builders accept its args."""

from pathlib import Path

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from deployments import app as app_module
from deployments import config as config_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config() -> ServeDeploySchema:
    return ServeDeploySchema.model_validate(yaml.safe_load((ROOT / "serve_config.yaml").read_text()))


def test_two_applications_with_one_http_route(config):
    routes = {a.name: a.route_prefix for a in config.applications}
    assert routes == {"default": "/", "vision": None}


def test_every_deployment_autoscales(config):
    for application in config.applications:
        for deployment in application.deployments:
            if deployment.name == "PrimaryDecoder":
                continue  # below
            scaling = deployment.autoscaling_config
            assert scaling and scaling["min_replicas"] >= 1 and scaling["max_replicas"] >= scaling["min_replicas"]
            assert deployment.max_ongoing_requests >= scaling["target_ongoing_requests"]


def test_the_builder_places_the_decoder(config, monkeypatch, smollm2):
    """Replicas and resources of the decoder depend on GPU or CPU (app.decoder_layout): settings
    here would replace the builder's for both. Its queue still holds a full batch."""
    monkeypatch.chdir(ROOT)
    main = next(a for a in config.applications if a.name == "default")
    decoder = next(d for d in main.deployments if d.name == "PrimaryDecoder")
    assert "autoscaling_config" not in decoder.model_fields_set
    assert "ray_actor_options" not in decoder.model_fields_set and "num_replicas" not in decoder.model_fields_set
    plan = config_module.resolve_plan(main.args)
    assert decoder.max_ongoing_requests >= plan.primary.params.max_num_seqs


def test_builders_accept_the_shared_args(config, monkeypatch, smollm2):
    monkeypatch.chdir(ROOT)  # serve run is started from the repository root
    for application in config.applications:
        module, _, builder = application.import_path.partition(":")
        assert module == app_module.__name__
        built = getattr(app_module, builder)(application.args)
        assert built is not None

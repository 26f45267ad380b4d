"""serve_config.yaml is a valid Serve config whose builders accept its args, and which leaves the
deployment options to the builder (one owner: deployments/options/)."""

from pathlib import Path

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from deployments import app as app_module
from deployments.config import AppArgs, cpu_cores, resolve_plan
from deployments.options import REPLICA_ENV, decoder_options

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config() -> ServeDeploySchema:
    return ServeDeploySchema.model_validate(yaml.safe_load((ROOT / "serve_config.yaml").read_text()))


def test_two_applications_with_one_http_route(config):
    routes = {a.name: a.route_prefix for a in config.applications}
    assert routes == {"default": "/", "vision": None}


def test_deployment_options_are_left_to_the_builder(config):
    for application in config.applications:
        assert application.deployments == [], application.name


@pytest.mark.parametrize("decoder_gpus", [0, 0.5])
def test_the_builder_gives_the_shipped_decoder_room_for_a_full_batch(config, monkeypatch, smollm2, decoder_gpus):
    monkeypatch.chdir(ROOT)
    main = next(a for a in config.applications if a.name == "default")
    args = AppArgs.model_validate({**main.args, "decoder_gpus": decoder_gpus})
    plan = resolve_plan(args)
    options, placed = decoder_options(args, plan.primary, cpu_cores())
    assert options["max_ongoing_requests"] >= plan.primary.params.max_num_seqs
    # The shipped GGUF runs on llama.cpp on CPU (one replica with every core), on transformers on a GPU.
    if decoder_gpus:
        assert placed.engine == "transformers"
    else:
        assert (placed.engine, options["num_replicas"], placed.params.cpu_threads) == ("llama.cpp", 1, cpu_cores())
    assert options["max_queued_requests"] > 0 and options["backpressure_config"]["retry_after_s"] > 0


def test_builders_accept_the_shared_args(config, monkeypatch, smollm2):
    monkeypatch.chdir(ROOT)  # serve run is started from the repository root
    for application in config.applications:
        module, _, builder = application.import_path.partition(":")
        assert module == app_module.__name__
        built = getattr(app_module, builder)(application.args)
        assert built is not None


def test_the_replicas_environment_is_left_to_the_builder(config):
    """The builder sets what each replica's process needs (`REPLICA_ENV`), so that `serve run
    deployments.app:build_app` and other configs get it too; the shipped config repeats none of it."""
    builders = set().union(*REPLICA_ENV.values())
    for application in config.applications:
        env = (application.runtime_env or {}).get("env_vars", {})
        assert not builders & set(env), application.name


def test_the_revision_arg_is_shared_and_read_by_nothing(config, monkeypatch, smollm2):
    """Serve rebuilds an application only when its entry in the config changes: bumping `revision`
    (shared by both applications) is how an edited models.yaml gets read again."""
    monkeypatch.chdir(ROOT)
    revisions = {application.name: application.args.get("revision") for application in config.applications}
    assert set(revisions) == {"default", "vision"} and len(set(revisions.values()) - {None}) == 1, revisions
    main = next(a for a in config.applications if a.name == "default")
    plans = [resolve_plan(AppArgs.model_validate({**main.args, "revision": r})) for r in (1, "2025-01-02")]
    assert plans[0] == plans[1]

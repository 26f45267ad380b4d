"""Every deployment's Serve options, set by the builder (`deployments/options.py`): the decoder's
placement and torch threads by GPU or CPU, and the queue and scaling bounds of each deployment."""

import os
from pathlib import Path

import pytest
import yaml

from deployments.config import AppArgs, DeploymentConfig, ModelConfig, cpu_cores, parse_models
from deployments.errors import ConfigError
from deployments.options import INGRESS, captioner_options, decoder_layout, decoder_options

ROOT = Path(__file__).resolve().parents[2]


def model(**params) -> ModelConfig:
    return ModelConfig.model_validate({"name": "llm", "hf_id": "org/llm", "params": {"max_num_seqs": 12, **params}})


def layout(cores: int, llm: ModelConfig, **args):
    return decoder_layout(AppArgs.model_validate(args), llm, cores)


@pytest.mark.parametrize(("cores", "replicas", "threads"), [(1, 1, 1), (2, 2, 1), (3, 2, 1), (16, 2, 8)])
def test_cpu_decoders_share_the_cores(cores, replicas, threads):
    options, placed = layout(cores, model(cpu_threads="all"), decoder_gpus=0)
    assert options == {"num_replicas": replicas, "ray_actor_options": {"num_cpus": 1 / replicas, "num_gpus": 0}}
    assert placed.params.cpu_threads == threads
    assert placed.params.model_dump(exclude={"cpu_threads"}) == model().params.model_dump(exclude={"cpu_threads"})


def test_cpu_replicas_and_threads_that_are_set_are_kept():
    options, placed = layout(16, model(cpu_threads=3), decoder_gpus=0, decoder_cpu_replicas=4)
    assert options["num_replicas"] == 4
    assert options["ray_actor_options"]["num_cpus"] == 0.25
    assert placed.params.cpu_threads == 3
    _, unset = layout(16, model(), decoder_gpus=0)
    assert unset.params.cpu_threads is None  # Ray's num_cpus decides


def test_gpu_decoders_autoscale_on_full_batches_and_ignore_cpu_settings():
    llm = model(cpu_threads="all")
    options, placed = layout(2, llm, decoder_gpus=1, decoder_cpu_replicas=4)
    assert options["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 1.0} and "num_replicas" not in options
    scaling = options["autoscaling_config"]
    assert (scaling["min_replicas"], scaling["max_replicas"], scaling["target_ongoing_requests"]) == (1, 2, 12)
    assert scaling["upscale_delay_s"] < scaling["downscale_delay_s"]
    assert placed == llm


def test_cpu_replicas_must_be_positive():
    with pytest.raises(ValueError, match="decoder_cpu_replicas"):
        AppArgs.model_validate({"decoder_cpu_replicas": 0})


def test_cores_are_those_this_process_may_run_on(monkeypatch):
    """A container's cpuset, not the host's core count (which os.cpu_count() gives)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5, 6}, raising=False)
    assert cpu_cores() == 3


def test_the_decoder_takes_two_batches_by_default_and_never_less_than_one():
    options, _ = decoder_options(AppArgs(decoder_gpus=0), model(), 2)
    assert (options["max_ongoing_requests"], options["max_queued_requests"]) == (24, 64)
    assert options["health_check_period_s"] == 2 and options["num_replicas"] == 2
    explicit = model().model_copy(update={"deployment": DeploymentConfig(max_ongoing_requests=12)})
    assert decoder_options(AppArgs(decoder_gpus=0), explicit, 2)[0]["max_ongoing_requests"] == 12
    below = model().model_copy(update={"deployment": DeploymentConfig(max_ongoing_requests=11)})
    with pytest.raises(ConfigError, match=r"max_ongoing_requests \(11\) is below params\.max_num_seqs \(12\)") as err:
        decoder_options(AppArgs(decoder_gpus=0, models_file="conf/models.yaml"), below, 2)
    assert str(err.value).startswith(f"{Path('conf/models.yaml').resolve()}: model 'llm': deployment.")


def test_the_commented_gpu_profile_keeps_one_batch_per_decoder_replica():
    """models.yaml's GPU profile (commented out) is valid, and its decoder takes 32 requests per
    replica as the old serve_config.yaml gave it, not the default 2 x max_num_seqs = 64."""
    path = ROOT / "models.yaml"
    text = path.read_text()
    lines = [line[2:] for line in text[text.index("# --- GPU profile") :].splitlines() if line.startswith("#")]
    profile = parse_models(yaml.safe_load("\n".join(lines[lines.index("models:") :])), path)
    primary = profile.models[0]
    options, _ = decoder_options(AppArgs(decoder_gpus=0.5), primary, 16)
    assert options["max_ongoing_requests"] == primary.params.max_num_seqs == 32


def test_the_captioner_autoscales_with_a_bounded_queue_and_its_own_gpu_share():
    captioner = ModelConfig(name="cap", hf_id="org/cap", deployment=DeploymentConfig(max_queued_requests=8))
    options = captioner_options(AppArgs(captioner_gpus=0.25), captioner)
    assert options["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 0.25}
    assert (options["max_ongoing_requests"], options["max_queued_requests"]) == (16, 8)
    scaling = options["autoscaling_config"]
    assert scaling["min_replicas"] == 1 and options["max_ongoing_requests"] >= scaling["target_ongoing_requests"]


def test_a_cpu_captioner_is_one_replica_so_crashed_decoders_get_their_cpu_back():
    """On CPU, Ray's CPUs are the cores the decoders share: a second captioner replica would add no
    throughput, and after a decoder crash it could take the CPU the decoders' replacements need."""
    options = captioner_options(AppArgs(captioner_gpus=0), ModelConfig(name="cap", hf_id="org/cap"))
    assert options["num_replicas"] == 1 and "autoscaling_config" not in options
    decoders, _ = decoder_layout(AppArgs(decoder_gpus=0), ModelConfig(name="d", hf_id="org/d"), cores=2)
    cpus = decoders["num_replicas"] * decoders["ray_actor_options"]["num_cpus"]
    assert cpus + options["ray_actor_options"]["num_cpus"] <= 2


def test_without_a_captioner_the_stub_replica_has_the_same_bounded_queue():
    stub = captioner_options(AppArgs(), None)
    assert stub["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 0.0} and "autoscaling_config" not in stub
    configured = captioner_options(AppArgs(captioner_gpus=0), ModelConfig(name="cap", hf_id="org/cap"))
    queue = ("max_ongoing_requests", "max_queued_requests", "backpressure_config", "health_check_period_s")
    assert {k: stub[k] for k in queue} == {k: configured[k] for k in queue}
    assert (stub["max_ongoing_requests"], stub["max_queued_requests"]) == (16, 64)


def test_the_ingress_autoscales_on_connections_with_no_cpu_reserved():
    scaling = INGRESS["autoscaling_config"]
    assert INGRESS["max_ongoing_requests"] >= scaling["target_ongoing_requests"] and scaling["min_replicas"] >= 1
    assert INGRESS["ray_actor_options"] == {"num_cpus": 0} and INGRESS["max_queued_requests"] > 0

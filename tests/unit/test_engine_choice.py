"""`engine: auto` resolved where the decoder or the captioner is placed (`options.decoder_layout`,
`options.placed_captioner`, the rule in `ModelConfig.resolved`), and the CPU layout of a llama.cpp
decoder: one replica with every core."""

import pytest

from deployments.config import AppArgs, AutoscalingConfig, Capabilities, DeploymentConfig, ModelConfig
from deployments.options import decoder_layout, placed_captioner


def layout(cores: int, llm: ModelConfig, **args):
    return decoder_layout(AppArgs.model_validate(args), llm, cores)


def hf_model() -> ModelConfig:
    return ModelConfig.model_validate({"name": "llm", "hf_id": "org/llm", "params": {"max_num_seqs": 12}})


def gguf(engine: str | None = None, **params) -> ModelConfig:
    """A GGUF decoder entry (max_num_seqs 12), with `engine` when given (else models.yaml's default)."""
    entry = {"name": "gguf", "local_path": "/m", "weight_file": "m.Q4_1.GGUF", "params": {"max_num_seqs": 12, **params}}
    return ModelConfig.model_validate({**entry, **({"engine": engine} if engine else {})})


def test_auto_runs_a_gguf_decoder_on_cpu_on_llama_cpp_and_everything_else_on_transformers(monkeypatch):
    import ray

    assert gguf().engine == "auto"
    engine = {}
    for where, args in {"cpu": {"decoder_gpus": 0}, "gpu": {"decoder_gpus": 0.5}}.items():
        engine[where] = layout(4, gguf(), **args)[1].engine
    assert engine == {"cpu": "llama.cpp", "gpu": "transformers"}
    # decoder_gpus auto: GPUs when the cluster has them.
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    for gpus, expected in ((0, "llama.cpp"), (2, "transformers")):
        monkeypatch.setattr(ray, "cluster_resources", lambda gpus=gpus: {"CPU": 4, "GPU": gpus})
        assert layout(4, gguf())[1].engine == expected
    # The model's own GPU share wins over the builder's.
    own = gguf().model_copy(update={"deployment": DeploymentConfig(num_gpus=0)})
    assert layout(4, own, decoder_gpus=1)[1].engine == "llama.cpp"
    # A GGUF native VLM (its projector beside it) runs on llama.cpp too; a Hugging Face model and an
    # engine that is named stay as they are.
    native = gguf().model_copy(update={"capabilities": Capabilities(vision_mode="native"), "mmproj_file": "p.gguf"})
    assert layout(4, native, decoder_gpus=0)[1].engine == "llama.cpp"
    assert layout(4, hf_model(), decoder_gpus=0)[1].engine == "transformers"
    for named in ("transformers", "llama.cpp", "fake", "mine:Engine"):
        assert layout(4, gguf(named), decoder_gpus=0)[1].engine == named


def test_auto_runs_a_gguf_captioner_on_llama_cpp_on_cpu_only():
    captioner = gguf().model_copy(update={"mmproj_file": "mmproj.gguf"})
    engines = {gpus: placed_captioner(AppArgs(captioner_gpus=gpus), captioner).engine for gpus in (0, 0.5)}
    assert engines == {0: "llama.cpp", 0.5: "transformers"}
    own = captioner.model_copy(update={"deployment": DeploymentConfig(num_gpus=0)})
    assert placed_captioner(AppArgs(captioner_gpus=1), own).engine == "llama.cpp"
    assert placed_captioner(AppArgs(captioner_gpus=0), hf_model()).engine == "transformers"


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 2), (16, 16)])
def test_a_llama_cpp_decoder_on_cpu_is_one_replica_with_every_core(cores, threads):
    """llama.cpp batches its slots in one process with OpenMP threads: one replica, its threads the
    cores (cpu_threads all, or unset), where the torch engines get two replicas of half the cores."""
    for params in ({"cpu_threads": "all"}, {}):
        options, placed = layout(cores, gguf(**params), decoder_gpus=0)
        assert options == {"num_replicas": 1, "ray_actor_options": {"num_cpus": 1.0, "num_gpus": 0}}
        assert (placed.engine, placed.params.cpu_threads) == ("llama.cpp", threads)
    assert layout(cores, gguf("transformers"), decoder_gpus=0)[0]["num_replicas"] == min(2, cores)


def test_a_llama_cpp_decoder_keeps_the_replicas_and_threads_a_user_sets():
    options, placed = layout(16, gguf(), decoder_gpus=0, decoder_cpu_replicas=4)
    assert (options["num_replicas"], placed.params.cpu_threads) == (4, 4)
    _, placed = layout(16, gguf(cpu_threads=3), decoder_gpus=0, decoder_cpu_replicas=4)
    assert placed.params.cpu_threads == 3
    scaled_gguf = gguf().model_copy(update={"deployment": DeploymentConfig(autoscaling=AutoscalingConfig())})
    options, placed = layout(16, scaled_gguf, decoder_gpus=0)
    assert options["autoscaling_config"]["max_replicas"] == 1 and placed.params.cpu_threads == 16
    bounded = AutoscalingConfig(max_replicas=2)
    options, placed = layout(
        16, gguf().model_copy(update={"deployment": DeploymentConfig(autoscaling=bounded)}), decoder_gpus=0
    )
    assert options["autoscaling_config"]["max_replicas"] == 2 and placed.params.cpu_threads == 8

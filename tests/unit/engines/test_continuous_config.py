"""The continuous-batching manager's configuration as transformers resolves it: `cuda_graphs: auto`
must not turn graphs on through the padding intervals (transformers reads any non-zero padding as a
request for CUDA graphs)."""

import pytest
import torch
from transformers.generation.continuous_batching import initialization

from deployments.config import EngineParams, ModelConfig
from deployments.engines import create_text_engine
from deployments.engines.transformers.continuous import ContinuousBatchingTextEngine, batching_config


@pytest.fixture(scope="module")
def engine(tiny_llm_dir):
    params = EngineParams(batching="continuous", max_num_seqs=2)
    built = create_text_engine(ModelConfig(name="tiny", local_path=str(tiny_llm_dir), params=params))
    assert isinstance(built, ContinuousBatchingTextEngine)
    yield built
    built.close()


def resolved_on_a_gpu(engine: ContinuousBatchingTextEngine, params: EngineParams, monkeypatch):
    """The engine's batching config resolved by transformers as on a machine with CUDA graphs (the
    device probe answers as a CUDA machine does; the rest is the library's own resolution, against the
    attention the manager runs)."""
    monkeypatch.setattr(initialization, "get_accelerator_graph_name", lambda: "CUDAGraph")
    config = batching_config(params, engine.num_blocks, engine.batch_tokens)
    return initialization.resolve_continuous_batching_config(
        engine.model.config, config, None, True, torch.device("cpu")
    )


def test_the_managers_resolved_config_has_no_graphs_on_cpu(engine):
    resolved = engine._manager.continuous_batching_config
    assert resolved.cuda_graph_booleans == (False, False)
    assert engine.describe()["cuda_graphs"] is False
    assert "sdpa" in engine.model.config._attn_implementation  # a masked attention: auto means no graphs


@pytest.mark.parametrize(
    ("cuda_graphs", "compile_level", "graphs", "padding"),
    [
        ("auto", 0, (False, False), 0),  # no padding passed: transformers' own rule for sdpa (no graphs)
        ("off", 0, (False, False), 0),
        ("on", 0, (True, True), 64),
        ("auto", 1, None, 64),  # compiling pads too; graphs then follow the compile config
    ],
)
def test_auto_means_no_graphs_on_a_graph_capable_device(
    engine, monkeypatch, cuda_graphs, compile_level, graphs, padding
):
    params = EngineParams(cuda_graphs=cuda_graphs, compile_level=compile_level, max_num_seqs=2)
    passed = batching_config(params, engine.num_blocks, engine.batch_tokens)
    assert passed.q_padding_interval_size == padding
    assert passed.kv_padding_interval_size == (params.graph_kv_padding if padding else 0)
    resolved = resolved_on_a_gpu(engine, params, monkeypatch)
    if graphs is not None:
        assert resolved.cuda_graph_booleans == graphs

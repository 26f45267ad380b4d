"""The engine registry: one spec per engine that the builder and the factory ask, custom
``module:Class`` engines answered too, and no engine's library imported until it is built."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys

import pytest

from deployments.config import EVERY_ENGINE, EngineParams, ModelConfig
from deployments.engines import create_caption_engine, create_text_engine
from deployments.engines.defaults import limits, setting
from deployments.engines.fake import FakeCaptionEngine, FakeTextEngine
from deployments.engines.registry import ENGINES, TORCH_ENV, check_settings, engine_replica_env, engine_spec
from deployments.errors import ConfigError
from deployments.protocol.replica import GenerateRequest


def test_every_engine_models_yaml_names_has_a_spec_under_its_name():
    assert set(ENGINES) == {"transformers", "llama.cpp", "fake"}
    assert all(name == spec.name for name, spec in ENGINES.items())


def test_placement_on_cpu_by_spec():
    """llama.cpp: one replica whose threads are its cores; the torch engines: two replicas."""
    llama, torch_engine = engine_spec("llama.cpp"), engine_spec("transformers")
    assert (llama.cpu_replicas, llama.threads_are_cores) == (1, True)
    assert (torch_engine.cpu_replicas, torch_engine.threads_are_cores) == (2, False)


def test_a_custom_engine_is_placed_as_the_torch_engines_and_auto_has_no_spec():
    custom = engine_spec("my.module:MyEngine")
    assert custom.name == "my.module:MyEngine"
    assert (custom.cpu_replicas, custom.threads_are_cores) == (engine_spec("transformers").cpu_replicas, False)
    with pytest.raises(ValueError, match="resolve it"):
        engine_spec("auto")


def test_a_custom_engine_is_checked_when_built():
    model = ModelConfig(name="mine", engine="deployments.engines.fake:FakeTextEngine")
    assert isinstance(create_text_engine(model), FakeTextEngine)
    with pytest.raises(ConfigError, match="is not a CaptionEngine"):
        create_caption_engine(model)
    with pytest.raises(ConfigError, match="cannot be imported"):
        create_text_engine(ModelConfig(name="gone", engine="no.such.module:Engine"))


def test_the_fake_engine_builds_both_kinds():
    model = ModelConfig(name="echo", engine="fake")
    assert isinstance(create_text_engine(model), FakeTextEngine)
    assert isinstance(create_caption_engine(model), FakeCaptionEngine)


def test_an_engine_replica_gets_every_engines_variables():
    env = engine_replica_env()
    assert env == TORCH_ENV  # llama.cpp's OpenMP spin is torch's
    for spec in ENGINES.values():
        assert spec.replica_env.items() <= env.items(), spec.name


@pytest.mark.parametrize(
    ("engine", "params", "words"),
    [
        ("llama.cpp", {"dtype": "float16"}, "engine llama.cpp does not read params.dtype (read by: transformers)"),
        ("llama.cpp", {"cuda_graphs": "on", "max_num_seqs": 4}, "llama.cpp does not read params.cuda_graphs"),
        ("transformers", {"kv_cache_dtype": "f16"}, "engine transformers does not read params.kv_cache_dtype"),
    ],
)
def test_a_setting_the_engine_does_not_read_is_refused_naming_both(engine, params, words):
    model = ModelConfig.model_validate({"name": "m", "local_path": "/nowhere", "engine": engine, "params": params})
    with pytest.raises(ConfigError, match=re.escape(words)):
        check_settings(model, engine)
    with pytest.raises(ConfigError, match=re.escape(f"model 'm': engine {engine}")):
        create_text_engine(model)  # refused before anything loads


def entry(engine: str, **params: object) -> ModelConfig:
    return ModelConfig.model_validate({"name": "m", "hf_id": "x", "engine": engine, "params": params})


def test_each_engine_takes_what_it_reads_and_every_setting_has_a_reader(caplog):
    check_settings(entry("llama.cpp", kv_cache_dtype="f16", max_tokens=9), "llama.cpp")
    check_settings(entry("transformers", dtype="float16", top_k=4), "transformers")
    check_settings(entry("mine.module:Engine", dtype="float16"), "mine.module:Engine")
    # `auto` runs on either engine by placement: what either reads is taken, and set aside on the other.
    with caplog.at_level(logging.INFO, logger="ray.serve"):
        check_settings(entry("auto", kv_cache_dtype="f16", dtype="float16"), "transformers")
    assert "engine auto runs on transformers here, which sets aside ['kv_cache_dtype']" in caplog.text
    real = [spec for spec in ENGINES.values() if spec.name != "fake"]
    claimed = set(EVERY_ENGINE).union(*(spec.settings or () for spec in real))
    assert claimed == set(EngineParams.model_fields)  # a new setting names the engines that read it


def test_asking_the_registry_imports_no_engine_library():
    """Specs and the fake engine import neither torch nor transformers nor xllamacpp; the
    constructors import their library when called."""
    code = (
        "import json, sys\n"
        "from deployments.engines.registry import ENGINES, engine_spec\n"
        "specs = [engine_spec(n) for n in ENGINES] + [engine_spec('x:Y')]\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'xllamacpp'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_a_request_setting_falls_back_to_the_models_default_in_one_place():
    params = EngineParams(temperature=0.3, top_k=5, max_tokens=40)
    assert setting(GenerateRequest(prompt="x", temperature=0.0), params, "temperature") == 0.0  # 0 is a value
    assert setting(GenerateRequest(prompt="x"), params, "temperature") == 0.3
    assert setting(GenerateRequest(prompt="x"), params, "top_k") == 5
    assert limits(100, GenerateRequest(prompt="x"), params).completion(90) == 10  # the default, cut to the room
    assert limits(100, GenerateRequest(prompt="x", max_tokens=7), params).completion(90) == 7
    with pytest.raises(ValueError):
        setting(GenerateRequest(prompt="x"), params, "max_tokens")

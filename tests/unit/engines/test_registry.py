"""The engine registry: one spec per engine that the builder and the factory ask, custom
``module:Class`` engines answered too, and no engine's library imported until it is built."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from deployments.config import ModelConfig
from deployments.engines import create_caption_engine, create_text_engine
from deployments.engines.fake import FakeCaptionEngine, FakeTextEngine
from deployments.engines.registry import ENGINES, TORCH_ENV, engine_replica_env, engine_spec
from deployments.errors import ConfigError


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


def test_params_an_engine_ignores_are_logged_when_it_is_built(caplog, monkeypatch):
    spec = engine_spec("fake")
    monkeypatch.setitem(ENGINES, "fake", type(spec)(**{**spec.__dict__, "ignored_params": ("dtype", "batching")}))
    model = ModelConfig.model_validate({"name": "echo", "engine": "fake", "params": {"dtype": "float16"}})
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        create_text_engine(model)
    assert "engine fake ignores these params: ['dtype']" in caplog.text


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

"""LoRA configuration and naming, without Ray or torch: `params.lora` is checked when models.yaml is
read (a listed adapter missing, over max_rank or made for another base fails with its path and why);
only the engines that read it take it; the ingress resolves '<base>:<adapter>' and an adapter's own
name to the model with that adapter (404 for others) and lists the listed adapters with `parent`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from deployments.config import EngineParams, LoraConfig, ModelConfig, parse_models
from deployments.config.lora import adapter_path
from deployments.engines.registry import ENGINES, check_settings
from deployments.errors import ConfigError, ModelNotFoundError
from deployments.ingress.health import HealthService
from deployments.ingress.served_models import AdapterView, ServedModel, ServedModels
from deployments.protocol.openai.models import ModelCard
from tests.unit.ingress.fakes import FakeDecoder, answer_core


def adapter(folder: Path, rank: int = 4, base: str | None = "tiny") -> Path:
    folder.mkdir(parents=True)
    config = {"peft_type": "LORA", "r": rank, "base_model_name_or_path": base}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def models_file(tmp_path: Path, lora: dict) -> dict:
    (tmp_path / "tiny").mkdir(exist_ok=True)
    entry = {"name": "tiny", "engine": "transformers", "local_path": "tiny", "params": {"lora": lora}}
    return {"models": [entry]}


def test_listed_adapters_are_resolved_and_checked(tmp_path):
    adapter(tmp_path / "adapters" / "a")
    lora = {"adapters": {"a": "adapters/a"}, "dynamic_path": "more", "max_adapters_per_replica": 2}
    parsed = parse_models(models_file(tmp_path, lora), tmp_path / "models.yaml")
    read = parsed.models[0].params.lora
    assert read is not None and read.adapters == {"a": str(tmp_path / "adapters" / "a")}
    assert read.dynamic_path == str(tmp_path / "more") and read.max_adapters_per_replica == 2
    assert adapter_path(read, "a") == read.adapters["a"] and adapter_path(read, "x") == f"{tmp_path}/more/x"


@pytest.mark.parametrize(
    ("rank", "base", "why"),
    [
        (None, None, "no adapter_config.json there"),
        (128, "tiny", "rank 128 is over max_rank 64"),
        (4, "org/other-model", "made for base model 'org/other-model'"),
    ],
)
def test_a_listed_adapter_that_cannot_serve_fails_the_build_with_its_path(tmp_path, rank, base, why):
    folder = tmp_path / "a"
    if rank is None:
        folder.mkdir()
    else:
        adapter(folder, rank, base)
    with pytest.raises(ConfigError) as err:
        parse_models(models_file(tmp_path, {"adapters": {"a": "a"}}), tmp_path / "models.yaml")
    assert "params.lora.adapters.a" in str(err.value) and str(folder) in str(err.value) and why in str(err.value)


def test_the_lora_section_is_strict():
    with pytest.raises(ValueError, match="no ':' or '/'"):
        LoraConfig(adapters={"base:x": "/a"})
    with pytest.raises(ValueError, match="extra"):
        LoraConfig.model_validate({"adapters": {}, "max_loras": 2})
    assert yaml.safe_dump(LoraConfig().model_dump())  # plain data


def test_the_engines_that_serve_adapters_own_the_setting():
    assert [spec.name for spec in ENGINES.values() if spec.name != "fake" and "lora" in (spec.settings or ())] == [
        "transformers",
        "llama.cpp",
    ]
    entry = ModelConfig(name="m", local_path="/m", engine="llama.cpp", params=EngineParams(lora=LoraConfig()))
    check_settings(entry, "llama.cpp")


def served(*, dynamic: bool = False) -> ServedModels:
    decoder = FakeDecoder()
    made: list[str] = []

    def core(name: str):
        made.append(name)
        return answer_core(decoder)

    view = AdapterView(("a", "b"), dynamic, core)
    base = ServedModel(
        ModelCard(id="tiny", created=1), answer_core(decoder), HealthService(decoder, None, model_name="tiny"), view
    )
    other = ServedModel(
        ModelCard(id="other", created=1), answer_core(decoder), HealthService(decoder, None, model_name="other")
    )
    return ServedModels([base, other])


def test_adapters_are_named_either_way_and_listed_with_their_parent():
    models = served()
    assert models.get("tiny:a").card.id == "tiny:a" and models.get("a").card.id == "tiny:a"
    assert models.get("tiny:a").core is models.get("a").core  # a listed adapter's core is kept
    assert models.get("tiny").card.parent is None
    cards = [(c.id, c.parent) for c in models.cards.data]
    assert cards == [("tiny", None), ("other", None), ("tiny:a", "tiny"), ("tiny:b", "tiny")]
    assert "parent" not in models.cards.data[0].model_dump()
    for unknown in ("tiny:c", "c", "other:a", "tiny:"):
        with pytest.raises(ModelNotFoundError):
            models.get(unknown)


def test_a_dynamic_path_lets_any_adapter_be_named_under_its_model():
    models = served(dynamic=True)
    assert models.get("tiny:c").card.id == "tiny:c"
    with pytest.raises(ModelNotFoundError):
        models.get("c")  # only '<model>:<adapter>' names an unlisted adapter

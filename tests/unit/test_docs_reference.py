"""The models.yaml reference (generated for the docs site by docs/hooks/reference.py) renders every
field of every configuration model that `deployments.config` exports, and each of those fields has a
description: a new field without one, or one the page leaves out, fails here."""

from __future__ import annotations

import importlib.util
import re
import sys
import typing
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel

import deployments.config

HOOK = Path(__file__).resolve().parents[2] / "docs" / "hooks" / "reference.py"
# Exported models that no file or argument is written in: what the builder resolves the configuration into.
RESOLVED = {"ServicePlan"}


def load_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mmserve_docs_reference", HOOK)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def nested_models(annotation: object) -> set[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {annotation}
    return {m for arg in typing.get_args(annotation) for m in nested_models(arg)}


def configuration_models() -> set[type[BaseModel]]:
    """Every model `deployments.config` exports, and every model their fields hold, all the way down."""
    exported = (getattr(deployments.config, name) for name in deployments.config.__all__)
    todo = [m for m in exported if isinstance(m, type) and issubclass(m, BaseModel) and m.__name__ not in RESOLVED]
    found: set[type[BaseModel]] = set()
    while todo:
        model = todo.pop()
        if model not in found:
            found.add(model)
            todo.extend(inner for info in model.model_fields.values() for inner in nested_models(info.annotation))
    return found


@pytest.fixture(scope="module")
def page() -> str:
    return load_hook().render()


def tables_by_model(page: str) -> dict[str, list[str]]:
    """Each section's rows, by the Python class the section names (`Python: `EngineParams`.`)."""
    tables: dict[str, list[str]] = {}
    for section in re.split(r"\n## ", page)[1:]:
        named = re.search(r"^Python: `(\w+)`\.$", section, re.M)
        assert named, section[:200]
        tables[named[1]] = [line for line in section.splitlines() if line.startswith("| <code>")]
    return tables


def test_every_configuration_model_has_a_table(page):
    tables = tables_by_model(page)
    for model in configuration_models():
        # A model without a section of its own (Lifecycle) is a base whose fields a section shows.
        covered = model.__name__ in tables or any(
            issubclass(other, model) and other.__name__ in tables for other in configuration_models()
        )
        assert covered, f"{model.__name__} is not in the models.yaml reference"


def test_every_field_is_a_row_with_its_description(page):
    tables = tables_by_model(page)
    for model in configuration_models():
        if model.__name__ not in tables:
            continue
        rows = tables[model.__name__]
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} has no Field(description=...)"
            key = re.compile(rf"^\| <code>(?:[^|]*\.<wbr>)?{name}</code> \|")
            matching = [row for row in rows if key.match(row)]
            assert len(matching) == 1, f"{model.__name__}.{name} is not one row of its table: {matching}"
            [row] = matching
            words = " ".join(info.description.split())
            assert words.replace("|", "\\|") in row, f"{model.__name__}.{name}: the row lacks its description"


def test_yaml_paths_are_written_out():
    hook = load_hook()
    keys = {key for section in hook.sections() for key, _ in section.rows}
    assert {"models[].params.max_num_seqs", "models[].deployment.autoscaling.min_replicas", "images.file_root"} <= keys
    assert "decoder_gpus" in keys  # builder arguments, under their own names

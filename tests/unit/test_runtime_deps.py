"""What the service needs at run time is installed by `pip install .` alone: `scripts/run.sh` installs
no extras, while the suite runs with the test extra, so a package that only a test tool brought in
would pass every test and still break a fresh clone's start (python-multipart did: FastAPI needs it
for /v1/files' form, and only a test dependency had pulled it in)."""

from __future__ import annotations

import ast
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
# Imported only where their feature is asked for, and said so where they are used.
OPTIONAL = {"pyarrow"}  # storage URIs (`pip install pyarrow`, docs/batches.md, docs/lora.md)


def runtime_closure(name: str) -> set[str]:
    """`name` and every distribution it requires, transitively, with the extras those requirements
    name (``ray[serve]``) and no others."""
    seen: set[tuple[str, str]] = set()
    todo: list[tuple[str, str]] = [(canonicalize_name(name), "")]
    while todo:
        current, extra = todo.pop()
        if (current, extra) in seen:
            continue
        seen.add((current, extra))
        try:
            required = requires(current) or []
        except PackageNotFoundError:
            continue
        for line in required:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": extra}):
                dependency = canonicalize_name(requirement.name)
                todo += [(dependency, ""), *((dependency, e) for e in requirement.extras)]
    return {dist for dist, _ in seen}


def imported_top_level(folder: Path) -> set[str]:
    names: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def test_every_package_the_service_imports_comes_with_its_runtime_install():
    closure = runtime_closure("mmserve")
    by_module = packages_distributions()
    third_party = imported_top_level(ROOT / "deployments") - set(sys.stdlib_module_names) - {"deployments"}
    missing = {
        module: by_module.get(module)
        for module in third_party - OPTIONAL
        if not any(canonicalize_name(d) in closure for d in by_module.get(module, []))
    }
    assert missing == {}


def test_fastapis_form_parser_comes_with_the_runtime_install():
    assert "python-multipart" in runtime_closure("mmserve")

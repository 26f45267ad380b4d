"""The package tree shows where code runs: the ingress side (and the builder that runs beside it)
never imports torch or transformers, the ingress never imports the model replicas' code, and the
batch runner never imports the ingress's. Each of those checks runs in a fresh interpreter, so that
modules other tests imported cannot fool it. Beside the package, imports between `tests/` and
`scripts/` go one way: scripts never import the tests (read from the sources' import statements).
Inside the package the import graph (read from the sources' import statements with `ast`, each
import followed to the modules it loads) keeps the layers: the wire types (`protocol`) reach nothing
else of the package, the batch runner no ingress module, no API folder another, the limits no API,
the guard no limits, and the stored state only the config, the errors and the wire types."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers")


def imported_after(module: str) -> set[str]:
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout.splitlines()[-1]))


def imported_after_all(package: str) -> set[str]:
    """The modules loaded, in a fresh interpreter, by importing `package` and every module in it."""
    code = (
        f"import importlib, json, pkgutil, sys, {package} as p\n"
        "for info in pkgutil.walk_packages(p.__path__, p.__name__ + '.'):\n"
        "    importlib.import_module(info.name)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize("module", ["deployments.ingress.deployment", "deployments.app", "deployments.config"])
def test_no_torch_or_transformers(module):
    modules = imported_after(module)
    assert module in modules
    assert not {m for m in modules if m.split(".")[0] in HEAVY}


def test_the_ingress_does_not_import_the_replicas_or_the_engines():
    modules = imported_after("deployments.ingress.deployment")
    assert not {m for m in modules if m.startswith(("deployments.replicas", "deployments.engines"))}


def test_the_batch_runner_loads_no_ingress_module():
    """The runner is a replica of its own: it reaches the ingress through a deployment handle, and
    shares with it only what lies below both (the stored state, the wire types)."""
    modules = imported_after_all("deployments.batch_runner")
    assert "deployments.batch_runner.runner" in modules
    assert sorted(m for m in modules if m == "deployments.ingress" or m.startswith("deployments.ingress.")) == []


def test_the_package_map_names_every_package_and_top_level_module_and_nothing_else():
    """docs/architecture.md's package map is the one map of the code: one row per package folder
    and per top-level module under deployments/, each path existing."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "architecture.md").read_text()
    table = page.split("\n## Package map\n", 1)[1].split("\n## ", 1)[0]
    mapped = set(re.findall(r"^\| `(deployments/[^`]*)` \|", table, re.M))
    package = root / "deployments"
    folders = {f"{p.relative_to(root).as_posix()}/" for p in package.rglob("*") if (p / "__init__.py").is_file()}
    modules = {p.relative_to(root).as_posix() for p in package.glob("*.py") if p.name != "__init__.py"}
    assert mapped == folders | modules


def test_an_endpoint_is_a_service_over_one_core_and_imports_no_other_endpoint():
    """A new API costs its wire in `protocol/`, a folder under ingress/apis/ (routes, service) and
    one mount: each service is built from one served model's core alone (a chat model's
    `AnswerCore`, an embedding model's `EmbeddingCore`), and shares code with the others only
    through the cores (never by importing another API)."""
    import importlib
    import inspect
    import pkgutil

    import deployments.ingress.apis as apis
    from deployments.ingress.answer.core import AnswerCore
    from deployments.ingress.embedding.core import EmbeddingCore

    cores = {AnswerCore.__name__, EmbeddingCore.__name__}
    names = [info.name for info in pkgutil.iter_modules(apis.__path__) if info.ispkg]
    assert {"chat", "completions", "embeddings", "messages", "responses", "tokenize"} <= set(names)
    for name in names:
        modules = {info.name for info in pkgutil.iter_modules([f"{apis.__path__[0]}/{name}"])}
        assert "routes" in modules, name
        if "service" not in modules:  # /v1/models and /health: routes over the served models alone
            continue
        module = importlib.import_module(f"{apis.__name__}.{name}.service")
        services = [c for n, c in vars(module).items() if n.endswith("Service") and c.__module__ == module.__name__]
        assert len(services) == 1, name
        parameters = list(inspect.signature(services[0]).parameters.values())
        assert len(parameters) == 1 and parameters[0].name == "core" and parameters[0].annotation in cores, name
        assert parameters[0].annotation in vars(module)


def imported_names(source: str) -> set[str]:
    """The modules a source's import statements name (relative imports, which stay in their package,
    left out)."""
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_imported_names_finds_every_import_form():
    source = "import os, tests.support\nfrom tests import conftest\nfrom . import x\ndef f():\n    import tests.unit\n"
    assert {"os", "tests.support", "tests", "tests.unit"} == imported_names(source)


def test_scripts_never_import_the_tests():
    """One direction between the two: the tests may import `scripts/` (the tiny models, the bench
    helpers), a script never imports `tests/`, so that no cycle comes back."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    offenders = {
        path.relative_to(root).as_posix(): sorted(
            n for n in imported_names(path.read_text()) if n.split(".")[0] == "tests"
        )
        for path in (root / "scripts").rglob("*.py")
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def _room_imports() -> dict[str, set[str]]:
    """Each room of the package (a top-level package or module of `deployments/`) and the rooms its
    modules import, read from the sources' import statements."""
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "deployments"
    rooms: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).with_suffix("").parts
        if parts == ("__init__",):
            continue
        room = parts[0]
        imported = {n.split(".")[1] for n in imported_names(path.read_text()) if n.startswith("deployments.")}
        rooms.setdefault(room, set()).update(imported - {room})
    return rooms


def test_the_rooms_import_each_other_without_a_circle():
    """Between the package's rooms the imports run one way: no room reaches back to one that imports it."""
    import graphlib

    rooms = _room_imports()
    graphlib.TopologicalSorter(rooms).static_order()  # raises CycleError on a circle


def test_stored_state_sits_under_the_ingress_and_the_batch_runner():
    """`deployments/state/` (files, batches, stored responses, conversations) imports only what is
    below both of its users, and the runner and the ingress are rooms that never import each other."""
    rooms = _room_imports()
    assert rooms["state"] <= {"config", "errors", "protocol"}, rooms["state"]
    assert "batch_runner" not in rooms["ingress"] | rooms["state"]
    assert "state" in rooms["batch_runner"]
    assert "ingress" not in rooms["batch_runner"]


PACKAGE = "deployments"


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Each module of the package and the package's modules that its import statements load (at any
    depth in its source, `TYPE_CHECKING` ones too): `from a.b import c` loads `a.b.c` where that is a
    module, and every import loads its packages' `__init__`s; relative imports resolved."""
    import ast

    root = Path(__file__).resolve().parents[2]
    paths = {
        ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): path
        for path in (root / PACKAGE).rglob("*.py")
    }

    def loaded(name: str) -> set[str]:
        parts = name.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & paths.keys()

    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.rsplit(".", node.level - 1)[0] if node.level else ""
                source = ".".join(part for part in (base, node.module or "") if part)
                names.add(source)
                names.update(f"{source}.{alias.name}" for alias in node.names)
        graph[module] = set().union(*(loaded(name) for name in names)) - {module} if names else set()
    return graph


def reached(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module that importing the modules at or under `start` loads (them included)."""
    seen: set[str] = set()
    stack = [m for m in graph if m == start or m.startswith(start + ".")]
    while stack:
        module = stack.pop()
        if module not in seen:
            seen.add(module)
            stack.extend(graph[module] - seen)
    return seen


def under(modules: set[str], *packages: str) -> set[str]:
    return {m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)}


def test_import_graph_reads_every_import_form():
    graph = import_graph()
    assert "deployments.ingress.limits.ledger" in graph["deployments.ingress.limits.board"]  # from a.b import c
    assert {"deployments", "deployments.ingress"} <= graph["deployments.ingress.limits.board"]  # the packages
    assert "deployments.ingress.apis.chat.routes" in graph["deployments.ingress.api"]  # from a.b import module
    assert "deployments.ingress.limits.ledger" in reached(graph, "deployments.ingress.deployment")  # at any depth


APIS = "deployments.ingress.apis"
API_FOLDERS = sorted(
    p.name
    for p in (Path(__file__).resolve().parents[2] / "deployments/ingress/apis").iterdir()
    if (p / "__init__.py").is_file()
)


@pytest.mark.parametrize("folder", API_FOLDERS)
def test_no_api_folder_reaches_another(folder):
    """An API shares code with the others only through what lies below them all (the cores, the
    wire types of `deployments/protocol/`): importing one API's folder loads no other API's module."""
    modules = under(reached(import_graph(), f"{APIS}.{folder}"), APIS)
    assert sorted(m for m in modules if m.split(".")[3:4] not in ([], [folder])) == []


def test_the_limits_reach_no_api_and_the_guard_no_limits():
    """The limits sit above the guard and below the APIs: the APIs declare how they are counted (their
    `counting.py`), the builder hands that table to the limits; the guard takes the limits file's
    named keys through a Protocol."""
    graph = import_graph()
    assert under(reached(graph, "deployments.ingress.limits"), "deployments.ingress.apis") == set()
    assert under(reached(graph, "deployments.ingress.guard"), "deployments.ingress.limits") == set()


def test_stored_state_loads_only_the_config_the_errors_and_the_wire_types():
    """`deployments/state/` sits below the ingress and the batch runner: importing it loads, of the
    package, only itself, `config`, `errors` and `protocol` (and they only each other)."""
    loaded = reached(import_graph(), "deployments.state")
    allowed = ("deployments.state", "deployments.config", "deployments.errors", "deployments.protocol")
    assert loaded - under(loaded, *allowed) - {PACKAGE} == set()


def test_the_wire_types_reach_nothing_else_of_the_package():
    """`deployments/protocol/` (every API's wire, the handles' payloads) lies under every room that
    speaks it: importing it loads, of the package, only itself."""
    loaded = reached(import_graph(), "deployments.protocol")
    assert loaded - under(loaded, "deployments.protocol") - {PACKAGE} == set()


def test_the_batch_runner_reaches_no_ingress_module():
    """The import graph's side of `test_the_batch_runner_loads_no_ingress_module`, `TYPE_CHECKING` imports too."""
    assert under(reached(import_graph(), "deployments.batch_runner"), "deployments.ingress") == set()


def test_no_api_folder_keeps_a_protocol_module():
    """An API's wire models live in `deployments/protocol/` (a module per API), not in its folder."""
    root = Path(__file__).resolve().parents[2] / "deployments/ingress/apis"
    assert sorted(p.relative_to(root).as_posix() for p in root.glob("*/protocol.py")) == []

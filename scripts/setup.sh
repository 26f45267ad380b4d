#!/usr/bin/env bash
# Create .venv, install the project and prepare the offline default model.
#   scripts/setup.sh          # runtime only
#   scripts/setup.sh client   # plus `openai`, for the README's Python example
#   scripts/setup.sh test     # plus test and lint tools (and `openai`)
# Quick when nothing changed: the install is skipped while .venv/.mmserve-setup records it for this
# pyproject.toml and this script.
# Python: the version pyproject.toml's requires-python names; PYTHON=python3.12 picks the interpreter
# that creates .venv. torch: machines with an NVIDIA GPU get the CUDA build from PyPI; others get
# torch 2.13.0, from TORCH_INDEX_URL when set (e.g. https://download.pytorch.org/whl/cpu for a small
# CPU-only wheel).
set -euo pipefail
cd "$(dirname "$0")/.."

extras="${1:-}"
case "$extras" in
  "") provides=(runtime) ;;
  client) provides=(runtime client) ;;
  test) provides=(runtime client test) ;;  # the test extra includes the client one
  *) echo "setup.sh: unknown extra '$extras' (none, client or test)" >&2; exit 2 ;;
esac

python="${PYTHON:-python3}"
[ -x .venv/bin/python ] && python=.venv/bin/python
need=$(sed -n 's/^requires-python *= *">=\([0-9.]*\)"$/\1/p' pyproject.toml)
[ -n "$need" ] || { echo 'setup.sh: no requires-python = ">=X.Y" in pyproject.toml' >&2; exit 1; }
if ! "$python" -c "import sys; sys.exit(sys.version_info[:2] < tuple(map(int, '$need'.split('.'))))" 2>/dev/null; then
  found=$(command -v "$python" >/dev/null && "$python" --version 2>&1 || true)
  echo "setup.sh: mmserve needs Python >= $need (requires-python in pyproject.toml); $python is: ${found:-not found}" >&2
  if [ "$python" = .venv/bin/python ]; then
    echo "  .venv was made with that Python: delete it, then run again with PYTHON=python$need (or newer)." >&2
  else
    echo "  Install Python $need or newer and run again with PYTHON=python$need (or its path)." >&2
  fi
  exit 1
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv

stamp=.venv/.mmserve-setup
key=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if grep -qx "$key ${extras:-runtime}" "$stamp" 2>/dev/null; then
  echo "setup.sh: .venv is up to date (${extras:-runtime})"
else
  pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
  if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "setup.sh: installing torch into .venv (the first time: minutes)"
    if command -v nvidia-smi >/dev/null 2>&1; then
      "${pip[@]}" "torch>=2.4"
    else
      "${pip[@]}" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==2.13.0"
    fi
  fi
  echo "setup.sh: installing mmserve${extras:+[$extras]} and its dependencies into .venv"
  "${pip[@]}" -e ".${extras:+[$extras]}"
  printf "$key %s\n" "${provides[@]}" >>"$stamp"
fi
.venv/bin/python scripts/prepare_models.py

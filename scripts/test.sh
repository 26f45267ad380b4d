#!/usr/bin/env bash
# Set up (idempotent) with test tools, lint, type-check and run the whole test suite.
# GPU tests run only where CUDA is available; they are skipped elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
.venv/bin/ruff format --check deployments tests scripts
.venv/bin/ruff check deployments tests scripts
.venv/bin/mypy
exec .venv/bin/python -m pytest tests "$@"

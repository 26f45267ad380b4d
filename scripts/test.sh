#!/usr/bin/env bash
# Set up (idempotent) with test tools, lint, type-check and run the whole test suite.
# GPU tests run only where CUDA is available; they are skipped elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
.venv/bin/ruff format --check deployments tests scripts
.venv/bin/ruff check deployments tests scripts
.venv/bin/mypy
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$(mktemp -d)"  # the docs site: broken links and anchors fail
exec .venv/bin/python -m pytest tests "$@"

#!/usr/bin/env bash
# Set up (idempotent), then benchmark this service against `transformers serve --continuous-batching`
# on the same model and machine. Arguments go to `python -m scripts.bench serve` (see its --help). Takes ~10 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
HF_HUB_OFFLINE=1 exec .venv/bin/python -m scripts.bench serve "$@"

#!/usr/bin/env bash
# Set up (idempotent) and start the service on http://127.0.0.1:8000 with serve_config.yaml.
# Extra arguments go to `serve run` (e.g. --address=auto to join a running Ray cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/serve run serve_config.yaml "$@"

#!/usr/bin/env bash
# Set up (quick when nothing changed) and serve serve_config.yaml on http://127.0.0.1:8000, in the
# foreground. Once the service answers, one line says so:
#   mmserve ready: http://127.0.0.1:8000 | model: ... | vision: ...
# Stop: Ctrl-C, or scripts/stop.sh from another shell (SIGTERM); Serve and the Ray processes it started
# exit with it. Extra arguments go to `serve run` (e.g. --address=auto to join a `ray start` cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo $$ >.mmserve.pid  # for scripts/stop.sh: after the exec below, $$ is `serve run`
.venv/bin/python scripts/ready.py --pid $$ &
exec .venv/bin/serve run serve_config.yaml "$@"

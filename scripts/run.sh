#!/usr/bin/env bash
# Set up (quick when nothing changed) and serve serve_config.yaml on http://127.0.0.1:8000, in the
# foreground. Once the service answers, one line says so:
#   mmserve ready: http://127.0.0.1:8000 | model: ... | vision: ...
# Stop: Ctrl-C, or scripts/stop.sh from another shell (SIGINT, as Ctrl-C); Serve and the Ray processes
# it started exit with it. Extra arguments go to `serve run` (e.g. --address=auto to join a `ray start`
# cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo $$ >.mmserve.pid  # for scripts/stop.sh: after the exec below, $$ is `serve run`
.venv/bin/python scripts/ready.py --pid $$ &
# A shell that starts run.sh with `&` (a script, CI) makes it ignore SIGINT, and an ignored signal stays
# ignored across exec: SIGTERM would then be the only way to stop it, which Ray answers with a stack
# dump and no graceful Serve shutdown. So SIGINT is set back to its default before `serve run` starts.
source scripts/ray_env.sh  # Ray's and Serve's settings for this service (the reasons are there)
exec .venv/bin/python -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
  .venv/bin/serve run serve_config.yaml "$@"

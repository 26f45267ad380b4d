#!/usr/bin/env bash
# Stop the service on this machine, and the Ray it runs on:
# - scripts/run.sh of this checkout: SIGINT, as Ctrl-C (Serve shuts its applications down, then Ray;
#   run.sh never ignores SIGINT, even started with `&` from a script; SIGTERM to one that does, from
#   an older checkout). The Ray processes it started exit with it (any still there 30 s later are killed);
# - a cluster started here with `ray start` (docs/clusters.md, or run.sh --address=auto):
#   `serve shutdown`, then `ray stop` (run `ray stop` on the other nodes yourself).
set -euo pipefail
cd "$(dirname "$0")/.."

alive() { local state; state=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${state:0:1}" != Z ]; }
descendants() { local child; for child in $(pgrep -P "$1" || true); do echo "$child"; descendants "$child"; done; }
any_alive() { local pid; for pid in "$@"; do alive "$pid" && return 0; done; return 1; }
wait_gone() { local t=$1; shift; while any_alive "$@"; do ((t-- > 0)) || return 1; sleep 1; done; }  # SECONDS PID...

stopped=
pid=$(cat .mmserve.pid 2>/dev/null || true)
if [ -n "$pid" ] && alive "$pid" && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "serve run"; then
  mapfile -t ray_pids < <(descendants "$pid")
  ignored=$(awk '/^SigIgn:/ {print $2}' "/proc/$pid/status")  # mask 0x2: SIGINT, ignored by an older run.sh
  if (((0x$ignored & 2) == 0)); then kill -INT "$pid"; else kill -TERM "$pid"; fi
  wait_gone 60 "$pid" || { echo "stop.sh: scripts/run.sh (pid $pid) still running after 60 s: killing it" >&2; kill -KILL "$pid"; }
  if ! wait_gone 30 "${ray_pids[@]}"; then
    left=$(for p in "${ray_pids[@]}"; do alive "$p" && echo "$p"; done)
    echo "stop.sh: killing Ray processes of scripts/run.sh still running 30 s after it:" $left >&2
    kill -KILL $left 2>/dev/null || true
  fi
  echo "stop.sh: stopped scripts/run.sh (pid $pid) and the ${#ray_pids[@]} processes under it"
  stopped=1
fi
rm -f .mmserve.pid

# A cluster started with `ray start` on this node writes its address here; its GCS answers while it runs.
address=$(cat "${RAY_TMPDIR:-${TMPDIR:-/tmp}}/ray/ray_current_cluster" 2>/dev/null || true)
if [ -n "$address" ] && timeout 2 bash -c "</dev/tcp/${address%:*}/${address##*:}" 2>/dev/null; then
  source scripts/env.sh
  serve shutdown -y || echo "stop.sh: serve shutdown failed (see above); stopping Ray anyway" >&2
  ray stop 2>&1 | tail -n 1  # its last line counts what it stopped
  echo "stop.sh: stopped Serve and the Ray cluster at $address (ray start)"
  stopped=1
fi
[ -n "$stopped" ] || echo "stop.sh: nothing to stop (no scripts/run.sh of this checkout, no \`ray start\` cluster here)"

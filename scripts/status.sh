#!/usr/bin/env bash
# `serve status` of the service on this machine (applications, deployments, replicas), with Ray's token
# auth (scripts/env.sh), then the service's own /health, then the captioner's state on one line, in the
# ready line's words (scripts/ready.py --vision-only): state, model, attempt, next attempt, cause.
# A captioner that cannot load is a STARTING replica in Serve's view (it waits in its constructor and
# retries; VisionCaptioner UPDATING, the vision application DEPLOYING) and `degraded` on /health and that line.
# Arguments go to `serve status`, e.g. --name default. MMSERVE_URL: the service (http://127.0.0.1:8000).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
serve status "$@" || echo "(serve status: no answer from Ray on this machine)"
export MMSERVE_URL="${MMSERVE_URL:-http://127.0.0.1:8000}"
echo "health ($MMSERVE_URL/health):"
curl -s -m 10 "$MMSERVE_URL/health" | python -m json.tool 2>/dev/null || echo "(no JSON answer from $MMSERVE_URL)"
python scripts/ready.py --vision-only || true

#!/usr/bin/env bash
# `serve status` of the service on this machine (applications, deployments, replicas), with Ray's token
# auth (scripts/env.sh), then the service's own /health. Both show a captioner that cannot load: Serve
# as `vision` UNHEALTHY with the loader's error in VisionCaptioner's message, /health as `degraded` and why.
# Arguments go to `serve status`, e.g. --name default. MMSERVE_URL: the service (http://127.0.0.1:8000).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
serve status "$@"
url="${MMSERVE_URL:-http://127.0.0.1:8000}"
echo "health ($url/health):"
curl -s -m 10 "$url/health" | python -m json.tool 2>/dev/null || echo "(no JSON answer from $url)"

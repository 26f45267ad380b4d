#!/usr/bin/env bash
# `serve status` of the service on this machine (applications, deployments, replicas), with Ray's token
# auth (scripts/env.sh). Arguments go to `serve status`, e.g. --name default.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
exec serve status "$@"

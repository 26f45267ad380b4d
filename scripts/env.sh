# Source it for the Ray CLI (`ray`, `serve`) of this checkout:  source scripts/env.sh
# It activates .venv, and sets RAY_AUTH_MODE=token when a Ray token exists (~/.ray/auth_token,
# RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH): Ray 2.60 turns token auth on for every cluster that
# `serve run` starts (making the token if there is none) and for `ray start --head` once a token
# exists, but its CLI sends the token only with RAY_AUTH_MODE=token. And the service's Ray settings
# (scripts/ray_env.sh), for the `ray start` of a cluster.
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv/bin/activate"
source "$(dirname "${BASH_SOURCE[0]}")/ray_env.sh"
if [ -z "${RAY_AUTH_MODE:-}" ] && { [ -n "${RAY_AUTH_TOKEN:-}" ] || [ -s "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}" ]; }; then
  export RAY_AUTH_MODE=token
fi

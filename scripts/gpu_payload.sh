#!/usr/bin/env bash
# Run here, on a machine with PyPI, before a GPU session: builds `.gpu/`, what the lent GPU machine (no
# network, Python 3.12 with torch, transformers 5.17 and common packages, no Ray or pydantic) needs for
# scripts/gpu_check.sh, and checks that it travels (the working tree and .gpu, 64 MiB in all):
#   - ../shared/gpu/make-payload.sh's wheels (transformers 5.23, pydantic, FastAPI, ...) and slim Ray;
#     nothing more: the rehearsal (docs/testing.md) found that the GPU tests and the benchmark import no
#     other package the machine lacks (llguidance, gguf, tiktoken and xllamacpp are imported only by
#     structured output, GGUF models, cl100k token ids and llama.cpp, which the check does not use);
#   - .gpu/tokenizer: the SmolLM2 tokenizer, saved from the offline default GGUF in models/ (98 MB,
#     which does not travel), for the tiny test models and the benchmark's model.
# Then, on the GPU machine, with `.gpu` carried: bash scripts/gpu_check.sh "$OUT"
#
# GPU_MAKE_PAYLOAD (default ../shared/gpu/make-payload.sh): a copy built for another Python, to rehearse
# on a CPU machine (docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
# From scratch: make-payload.sh keeps a ray-slim.tar.xz it finds, which may be for another Python.
rm -rf .gpu
bash "${GPU_MAKE_PAYLOAD:-../shared/gpu/make-payload.sh}" .gpu

PYTHONPATH=. .venv/bin/python -c \
  "from scripts.bench.tiny_models import _tokenizer; _tokenizer().save_pretrained('.gpu/tokenizer')"

# What travels: the files git tracks or would add (untracked, not ignored), and .gpu.
tree=$(git ls-files -z --cached --others --exclude-standard | { xargs -0 stat -c %s 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}')
payload=$(du -sb .gpu | cut -f1)
total=$((tree + payload))
awk -v t="$tree" -v p="$payload" 'BEGIN {m = 1048576; printf "travels: tree %.1f MiB + .gpu %.1f MiB = %.1f MiB (limit 64)\n", t / m, p / m, (t + p) / m}'
if ((total > 64 * 1048576)); then
  echo "gpu_payload: over 64 MiB; the machine would not get it all" >&2
  exit 1
fi

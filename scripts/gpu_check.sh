#!/usr/bin/env bash
# One offline check on any CUDA machine (about 5 minutes on an H100 or H200):
#   1. the GPU tests: engines on the card, captured steps (graphs on and off give the same greedy
#      tokens; a seed reproducible beside other requests), and the service with the decoder and the
#      captioner packed at half a card each (text, an image not degraded, a stream, 16 at once, both
#      replicas holding memory on the same card);
#   2. the engine on a random model of SmolLM2-1.7B's shape, cuda_graphs off and on, against plain
#      `generate` and the measured bandwidth roofline, as a table (python -m scripts.bench gpu).
#
#   scripts/gpu_check.sh [OUT_DIR]     # logs and results in OUT_DIR (default build/gpu-check)
#
# Python: .venv/bin/python where scripts/setup.sh made it, else python3 with the packages on its path
# (a machine with no network: ../shared/gpu's payload). The tiny test models and the benchmark's model
# use the SmolLM2 tokenizer: saved once into OUT_DIR/tokenizer from the offline default GGUF where
# models/ has it; on a machine without it, bring that folder (3 MB) along.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/gpu-check}
mkdir -p "$out"
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1
if [ ! -f "$out/tokenizer/tokenizer.json" ]; then
  "$py" -c "from scripts.bench.tiny_models import _tokenizer; _tokenizer().save_pretrained('$out/tokenizer')" || exit 1
fi
export MMSERVE_TOKENIZER_DIR="$PWD/$out/tokenizer"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt" || {
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi failed)" >&2
  exit 1
}
status=0
echo "== GPU tests"
timeout 240 "$py" -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "$out/tests.log" | tail -15
[ "${PIPESTATUS[0]}" = 0 ] || status=1
echo "== engine benchmark"
timeout 300 "$py" -m scripts.bench gpu --tokenizer "$out/tokenizer" 2>"$out/bench.err" | tee "$out/bench.txt"
[ "${PIPESTATUS[0]}" = 0 ] || { status=1; tail -20 "$out/bench.err"; }
exit $status

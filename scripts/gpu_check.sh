#!/usr/bin/env bash
# One offline check on any CUDA machine (within 8 minutes on an H100 or H200), measuring first so that a
# short lease brings the numbers back:
#   1. the engines on a random model of SmolLM2-1.7B's shape: the static-slot decoder (every decode bucket
#      captured at start; captures in the timed window counted) and the old engine eager as the baseline,
#      end-to-end and decode-only tok/s and TTFT, against plain `generate` and the measured bandwidth
#      roofline, as a table (python -m scripts.bench gpu);
#   2. Serve's own cost on the card: the static decoder on the same model alone and through the service
#      (`serve run`: the proxy, the ingress, the decoder's handle), the TTFT the service adds at c1 and its
#      tokens/s over the engine's at c32 (python -m scripts.bench overhead);
#   3. agent sessions on the transformers engine (issue 68): the same random model on 2 decoder replicas at
#      half a card each, Serve's default router against ours, 6 sessions x 4 turns of ~1,200-token system
#      texts: warm TTFT and cached share (python -m scripts.bench sessions; last, so it never takes the
#      tests' time: where the budget ran out, run it alone, the command in its log line below);
#   4. the GPU tests: engines on the card, captured steps (the static decoder's captured tokens equal
#      `generate`; graphs on and off give the same greedy tokens; a seed reproducible beside other
#      requests), and the service with the decoder and the captioner packed at half a card each (text, an
#      image not degraded, a stream, 16 at once, both replicas holding memory on the same card).
#
#   scripts/gpu_check.sh [--rehearse] [OUT_DIR]     # logs and OUT_DIR/summary.txt (default build/gpu-check)
#
# On the lent GPU machine (no network; `.gpu` built here by scripts/gpu_payload.sh and carried):
#   bash scripts/gpu_check.sh "$OUT"
# `--rehearse` runs the same steps on a CPU machine: no nvidia-smi, the GPU tests only collected (they skip
# without CUDA, so collection proves every import) and a tiny benchmark. Each step runs under its own
# `timeout` within GPU_CHECK_BUDGET seconds in all (default 540, under the device's 600 s per command), and
# writes its log to OUT_DIR as it goes, so a run cut short still brings back what it did.
#
# Python: MMSERVE_PYTHON, else .venv/bin/python where scripts/setup.sh made it, else python3. Where `.gpu/`
# is here and that Python has no Ray, it is installed from `.gpu/` into GPU_CHECK_SITE (default /tmp/site)
# the way ../shared/gpu/make-payload.sh says. The tokenizer of the tiny test models and of the benchmark's
# model: `.gpu/tokenizer`, else saved from the offline default GGUF in models/ (which does not travel).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
rehearse=0
if [ "${1:-}" = --rehearse ]; then rehearse=1 && shift; fi
out=${1:-build/gpu-check}
mkdir -p "$out" && out=$(cd "$out" && pwd)
deadline=$((SECONDS + ${GPU_CHECK_BUDGET:-540}))
summary=$out/summary.txt
: >"$summary"
status=0

note() { echo "$*" | tee -a "$summary"; }

# step NAME LIMIT CMD...: CMD under `timeout` (LIMIT seconds, less if the budget has less left), its
# output in OUT_DIR/NAME.log, one line in the summary; the log's tail on the terminal when it fails.
step() {
  local name=$1 limit=$2 start=$SECONDS rc
  shift 2
  ((limit > deadline - SECONDS)) && limit=$((deadline - SECONDS))
  if ((limit < 10)); then
    note "$name: not run, out of time"
    status=1 && return 1
  fi
  echo "== $name (at most ${limit} s)"
  timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
  rc=$?
  if [ $rc = 0 ]; then
    note "$name: ok in $((SECONDS - start)) s"
  else
    note "$name: FAILED (exit $rc$([ $rc = 124 ] && echo ", timed out after $limit s")) in $((SECONDS - start)) s; see $name.log"
    tail -n 20 "$out/$name.log"
    status=1
  fi
  return $rc
}

py=${MMSERVE_PYTHON:-python3}
[ -z "${MMSERVE_PYTHON:-}" ] && [ -x .venv/bin/python ] && py=.venv/bin/python
site=${GPU_CHECK_SITE:-/tmp/site}
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH" HF_HUB_OFFLINE=1
note "gpu_check $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null) python $("$py" -V 2>&1)$([ $rehearse = 1 ] && echo ', rehearsal')"

if [ -d .gpu/whl ] && ! "$py" -c 'import ray' 2>/dev/null; then
  step install 150 bash -c "'$py' -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target '$site' .gpu/whl/*.whl && tar xJf .gpu/ray-slim.tar.xz -C '$site'" || exit 1
fi

tokenizer=$PWD/.gpu/tokenizer
if [ ! -f "$tokenizer/tokenizer.json" ]; then
  tokenizer=$PWD/build/gpu-check-tokenizer
  [ -f "$tokenizer/tokenizer.json" ] || step tokenizer 120 "$py" -c \
    "from scripts.bench.tiny_models import _tokenizer; _tokenizer().save_pretrained('$tokenizer')" || exit 1
fi
export MMSERVE_TOKENIZER_DIR=$tokenizer

bench=()
overhead=(--gpu-shape smollm2-1.7b --concurrency 1 32)
sessions=(--gpu-shape smollm2-1.7b --layouts serve ours --sessions 6 --turns 4 --system-tokens 1200 --new-tokens 24)
if [ $rehearse = 1 ]; then
  bench=(--shape tiny --concurrency 1 4 --max-tokens 16)
  overhead=(--gpu-shape tiny --concurrency 1 4 --max-tokens 16 --rounds 2)
  sessions=(--gpu-shape tiny --layouts ours --sessions 2 --turns 2 --system-tokens 200 --new-tokens 8)
else
  gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader) || {
    note "no NVIDIA GPU here (nvidia-smi failed); on a CPU machine: --rehearse"
    exit 1
  }
  note "gpu: $gpu"
fi

# What the check imports, with versions, in the summary: a package the machine lacks is named at once.
step versions 60 "$py" -c 'import importlib, torch
for name in ("torch", "transformers", "tokenizers", "ray", "pydantic", "fastapi", "httpx", "prometheus_client", "pytest_asyncio"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "present"))
    except Exception as exc:
        print(name, "MISSING:", exc)
print("cuda", torch.version.cuda, "available" if torch.cuda.is_available() else "not available")'
sed 's/^/  /' "$out/versions.log" >>"$summary"
step bench 270 "$py" -m scripts.bench gpu --tokenizer "$tokenizer" "${bench[@]}"
# The table: what the benchmark prints after its JSON lines, from its title line on.
[ -f "$out/bench.log" ] && sed -n '/greedy tokens$/,$p' "$out/bench.log" | tee -a "$summary"
step overhead 150 "$py" -m scripts.bench overhead --tokenizer "$tokenizer" "${overhead[@]}"
[ -f "$out/overhead.log" ] && grep -E '"(where|ttft_added_ms)"' "$out/overhead.log" | sed 's/^/  /' | tee -a "$summary"
# A module that fails to import fails its own tests, not the others'.
step tests 240 "$py" -m pytest tests/gpu -q -p no:cacheprovider --continue-on-collection-errors
sessions+=(--tokenizer "$tokenizer" --port 8124)
note "sessions: $py -m scripts.bench sessions ${sessions[*]}"
step sessions 240 "$py" -m scripts.bench sessions "${sessions[@]}"
[ -f "$out/sessions.log" ] && grep '"layout"' "$out/sessions.log" | sed 's/^/  /' | tee -a "$summary"
note "gpu_check: $([ $status = 0 ] && echo passed || echo FAILED) in $SECONDS s"
exit $status

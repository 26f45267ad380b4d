#!/usr/bin/env bash
# Opt-in: rebuild the llama.cpp engine (xllamacpp, the version pyproject.toml pins) from its source
# distribution on this machine, with this machine's compiler and CPU kernels, into .venv. The PyPI wheel
# stays the default (it installs in seconds). On the 2-core machine of docs/benchmarks.md the wheel made
# 0.87x-0.92x the tokens/s of a llama-server built there at one stream, a build here 0.96x-1.06x; the
# script took 7 min 46 s there, without LLGuidance (docs/running.md, "A llama.cpp built on this machine").
#
#   scripts/setup.sh && scripts/build_llama.sh      # build, install, check it answers (else the wheel again)
#   scripts/build_llama.sh --wheel                  # back to the PyPI wheel
#
# Needs a C++ compiler, cmake and, for structured output (LLGuidance, which llama.cpp builds with cargo
# from GitHub and crates.io), Rust's cargo and network access. Settings:
#   MMSERVE_LLAMA_CMAKE_ARGS   llama.cpp's CPU kernels; default -DGGML_NATIVE=ON (this CPU's own). Where the
#                              native build fails its check (a virtual CPU that advertises instructions it
#                              refuses), name them: "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
#   MMSERVE_LLAMA_LLGUIDANCE   on (default) or off: off builds without LLGuidance (no cargo, no network): JSON
#                              schemas still hold (llama.cpp's own grammars, without the whitespace bound), and
#                              vLLM's structured_outputs regex, choice and grammar are refused with a 400
#   NPROC                      compile jobs (default: the cores)
# A later scripts/setup.sh keeps the local build while pyproject.toml pins the same version; a new pin
# brings the new version's wheel (run this again).
set -euo pipefail
cd "$(dirname "$0")/.."

[ -x .venv/bin/python ] || { echo "build_llama.sh: no .venv: run scripts/setup.sh first" >&2; exit 1; }
version=$(sed -n 's/^ *"xllamacpp==\([^"]*\)",*$/\1/p' pyproject.toml)
[ -n "$version" ] || { echo 'build_llama.sh: no "xllamacpp==VERSION" in pyproject.toml' >&2; exit 1; }
pip=(.venv/bin/python -m pip --disable-pip-version-check)

wheel() {
  echo "build_llama.sh: installing the PyPI wheel of xllamacpp $version"
  "${pip[@]}" install --quiet --force-reinstall --no-deps --only-binary xllamacpp "xllamacpp==$version"
}
if [ "${1:-}" = --wheel ]; then
  wheel
  exit 0
fi
[ -z "${1:-}" ] || { echo "build_llama.sh: unknown argument '$1' (none, or --wheel)" >&2; exit 2; }

guidance=${MMSERVE_LLAMA_LLGUIDANCE:-on}
case "$guidance" in
  on) command -v cargo >/dev/null || {
        echo "build_llama.sh: xllamacpp $version's LLGuidance (structured output) is built with Rust's cargo, not" \
          "found here: install Rust (https://rustup.rs), or set MMSERVE_LLAMA_LLGUIDANCE=off to build without it" >&2
        exit 1
      }
      flag=ON ;;
  off) flag=OFF
       echo "build_llama.sh: without LLGuidance: structured_outputs regex, choice and grammar will be refused" ;;
  *) echo "build_llama.sh: MMSERVE_LLAMA_LLGUIDANCE is on or off, not '$guidance'" >&2; exit 2 ;;
esac
kernels=${MMSERVE_LLAMA_CMAKE_ARGS:--DGGML_NATIVE=ON}
# The server listens on 127.0.0.1 only: no TLS library (llama.cpp would download BoringSSL).
export CMAKE_ARGS="$kernels -DLLAMA_LLGUIDANCE=$flag -DLLAMA_BUILD_BORINGSSL=OFF -DLLAMA_OPENSSL=OFF"
export NPROC=${NPROC:-$(nproc)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "build_llama.sh: building xllamacpp $version from source (CMAKE_ARGS: $CMAKE_ARGS; minutes)"
started=$SECONDS
"${pip[@]}" wheel --quiet --no-deps --no-binary xllamacpp "xllamacpp==$version" -w "$out"
"${pip[@]}" install --quiet --force-reinstall --no-deps "$out"/xllamacpp-*.whl
echo "build_llama.sh: built and installed in $((SECONDS - started)) s; checking that it answers"
# The engine alone on models.yaml's first model, one short stream: a build whose kernels this CPU refuses
# dies here, and the wheel comes back.
if ! .venv/bin/python -m scripts.bench engines --engines llama.cpp --concurrency 1 --rounds 1 --max-tokens 16; then
  echo "build_llama.sh: the local build failed its check; back to the wheel (try MMSERVE_LLAMA_CMAKE_ARGS)" >&2
  wheel
  exit 1
fi
echo "build_llama.sh: xllamacpp $version is now this machine's build (scripts/build_llama.sh --wheel undoes it)"

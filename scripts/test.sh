#!/usr/bin/env bash
# Runs the whole test suite: installs dependencies and the default assets (scripts/setup.sh),
# builds once, then runs every test in parallel with CTest. GPU tests skip with a visible
# reason when no CUDA device is present. Then scripts/fuzz.sh (skip it with RP_SKIP_FUZZ=1).
# Exit status: CTest's, then the fuzzer's.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=$(nproc)
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "[test] no CUDA device visible: the CUDA tests will be skipped (reason printed by each as 'no CUDA device visible')"
fi
ctest --test-dir build -j"$jobs" --output-on-failure --timeout 1200 "$@"
# Every reader of user files (GGUF, safetensors, config, spec, JSONL, optimizer and trainer
# state) fuzzed under AddressSanitizer and UBSan, in a CPU-only build of its own (build-asan/).
[ "${RP_SKIP_FUZZ:-0}" = 1 ] || scripts/fuzz.sh

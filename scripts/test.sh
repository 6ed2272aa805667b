#!/usr/bin/env bash
# Runs the whole test suite: installs dependencies and the default assets (scripts/setup.sh),
# builds once, then runs every test in parallel with CTest. GPU tests skip with a visible
# reason when no CUDA device is present. Exit status is CTest's.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=$(nproc)
ctest --test-dir build -j"$jobs" --output-on-failure --timeout 1200 "$@"

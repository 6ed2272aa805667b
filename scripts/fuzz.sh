#!/usr/bin/env bash
# Builds the reader fuzzer (tests/fuzz/fuzz_readers.cpp) with AddressSanitizer and UBSan in its
# own build folder (build-asan/, CPU only, only the fuzzer and the libraries it reads with) and
# runs a bounded number of mutated inputs per reader: GGUF, safetensors, config.json, spec,
# JSONL, optimizer.bin, trainer_state.json. Fails on a crash or sanitizer report, a hang (a case
# over 60 s) or an allocation over 1 GiB (the seeds are a few KiB: such a size came from a
# corrupted count). scripts/test.sh runs it after the test suite, as CI does.
#   scripts/fuzz.sh                 # RP_FUZZ_CASES cases per reader (default 10000, about 20 s; the build about 3 min on 2 cores)
#   RP_FUZZ_CASES=20000 scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cases=${RP_FUZZ_CASES:-10000}
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
san="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release -DRP_WITH_CUDA=OFF -DRP_NATIVE=OFF "${launcher[@]}" \
  -DCMAKE_CXX_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
cmake --build build-asan -j"$(nproc)" --target fuzz_readers
export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=0:max_allocation_size_mb=1024:hard_rss_limit_mb=4096:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
build-asan/tests/fuzz_readers --cases "$cases" --timeout-s 60

#!/usr/bin/env bash
# The CUDA tests of a generic-architecture bundle (scripts/build_generic_arch.sh) on the lent
# GPU machine: built as compute_80 (or compute_89) PTX only, the kernels are JIT-compiled by
# the driver and every `__CUDA_ARCH__ >= 900` branch is compiled out, so an H200 runs the code
# an A100 / RTX 3090 / RTX 4090 runs. A second pass caps shared memory per block at a GeForce
# card's 99 KiB (RP_CUDA_MAX_SMEM_KIB) and runs the attention and norm tests again. Run from
# the repository root with the bundle carried:
#   BUNDLE=.device-arch80 RP_BUILD_SRC=<source path of the build machine> bash bench/device_generic_arch.sh
#   DO_GOLDEN=0  skip making the Hugging Face golden fixtures (needs torch + transformers there;
#                without them the parity tests skip)
# Prints one summary line per test program and pass; the log goes to $OUT/generic_arch.log.
set -uo pipefail
BUNDLE=${BUNDLE:-.device-arch80}
[ -x "$BUNDLE/bin/test_kernels" ] || { echo "device_generic_arch.sh: no $BUNDLE/bin/test_kernels (scripts/build_generic_arch.sh makes it)" >&2; exit 2; }
cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH=$PWD/$BUNDLE/lib:/usr/local/cuda/lib64:${cudnn_lib:+$cudnn_lib:}${LD_LIBRARY_PATH:-}
export CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-/tmp/rp-jit-cache}  # the JIT's output, reused by later programs
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/generic_arch.log") 2>&1
# the tests look for fixtures at the build machine's source path
[ -n "${RP_BUILD_SRC:-}" ] && mkdir -p "$(dirname "$RP_BUILD_SRC")" && ln -sfn "$PWD" "$RP_BUILD_SRC"
nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader
echo "bundle $BUNDLE: $(cat "$BUNDLE/ARCH" 2>/dev/null || echo '?')"
step() { echo "=== $* ($(date +%T))"; }
if [ "${DO_GOLDEN:-1}" = 1 ]; then
  step golden fixtures
  python3 tests/fixtures/hf_golden/make_golden.py tests/fixtures/hf_golden >/dev/null 2>&1 || echo "(golden fixtures not made: the parity tests skip)"
fi
summary=()
# run NAME PROGRAM FILTER [ENV=VALUE...]: one gtest program, its counts into the summary
run() {
  local name=$1 prog=$2 filter=$3; shift 3
  step "$name"
  if [ ! -x "$BUNDLE/bin/$prog" ]; then  # a bundle made with TARGETS=test_kernels
    summary+=("$(printf '%-22s not in the bundle' "$name")"); return
  fi
  local log=$OUT/gtest_$name.txt
  env "$@" timeout "${TEST_TIMEOUT:-900}" "$BUNDLE/bin/$prog" --gtest_brief=1 --gtest_filter="$filter" > "$log" 2>&1
  local rc=$?
  grep -E "roundpipe: |^\[  FAILED  \]|\[  PASSED  \]|\[  SKIPPED \]|Failure|error" "$log" | sort | uniq -c | head -40
  local p f s
  p=$(grep -oE '\[  PASSED  \] [0-9]+' "$log" | grep -oE '[0-9]+$' || echo 0)
  f=$(grep -oE '\[  FAILED  \] [0-9]+ tests?' "$log" | grep -oE '[0-9]+' || echo 0)
  s=$(grep -oE '\[  SKIPPED \] [0-9]+ tests?' "$log" | grep -oE '[0-9]+' || echo 0)
  summary+=("$(printf '%-22s rc=%-3s passed %-4s failed %-3s skipped %s' "$name" "$rc" "${p:-0}" "${f:-0}" "${s:-0}")")
}
run kernels test_kernels '*'
run model test_model 'HfParity.Cuda*:Generate.*:LoraPeft.Cuda*:LoraPeft.Dropout*:LoraExpertsPeft.Cuda*'
run actors test_actors 'RuntimeCuda.*:ProfilerCuda.*:MemoryFlat.DeviceMemory*'
# a GeForce card's shared memory per block: the 4-warp / unpipelined flash kernels
run kernels_smem99 test_kernels '*Attention*:*GptOss*:*Gqa*:*RMSNorm*:DeviceArch.*' RP_CUDA_MAX_SMEM_KIB=99
step summary
printf '%s\n' "${summary[@]}" | tee "$OUT/generic_arch_summary.txt"

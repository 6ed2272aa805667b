#!/usr/bin/env bash
# On the lent GPU machine: the GPU tests of the FP8 ops, fp16 GEMM accumulation, the start-up
# architecture check and fp16 loss scaling end to end, then the FP8 GEMM benchmark (bf16 vs
# e4m3 at the Qwen3/LLaMA linear shapes, quantize GB/s, the sustained e4m3 rate) with nvidia-smi
# power and SM clock sampled beside it. Expects the bundle in .device/ (bin/test_kernels,
# test_actors, test_trainer, bench_fp8_ops_bench; lib/); writes under $OUT.
#   RP_BUILD_SRC=<source path of the build machine> bash bench/device_checks.sh
set -uo pipefail
cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${cudnn_lib:+$cudnn_lib:}${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/checks.log") 2>&1
[ -n "${RP_BUILD_SRC:-}" ] && mkdir -p "$(dirname "$RP_BUILD_SRC")" && ln -sfn "$PWD" "$RP_BUILD_SRC"
step() { echo "=== $* ($(date +%T))"; }
gt() {  # PROGRAM FILTER: one gtest program, its summary lines
  step "$1 $2"
  timeout "${TEST_TIMEOUT:-300}" ".device/bin/$1" --gtest_brief=1 --gtest_filter="$2" > "$OUT/gt_$1.txt" 2>&1
  echo "rc=$?"; grep -E "^\[  FAILED  \]|\[  PASSED  \]|\[  SKIPPED \]|\[ info \]|Failure|runs this build" "$OUT/gt_$1.txt" | head -40
}
gt test_kernels "${KERNEL_FILTER:-*Fp8*:CudaF16*:F16Accumulation.*:DeviceArch.*}"
gt test_actors "${ACTOR_FILTER:-LossScalingCuda.*:AsyncWeightPrediction.*}"
gt test_trainer "${TRAINER_FILTER:-LossScalingCudaTrainer.*:AsyncLrRange.*:AsyncCompensation.*:GemmAccumulate.*}"
if [ "${DO_FP8_BENCH:-1}" = 1 ]; then
  step fp8 benchmark
  nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm --format=csv,noheader -lms 500 > "$OUT/smi_fp8.csv" &
  sp=$!
  timeout 240 .device/bin/bench_fp8_ops_bench > "$OUT/fp8_ops.md" 2>&1; echo "rc=$?"
  timeout 120 .device/bin/bench_fp8_ops_bench --sustained "${SUSTAINED_S:-12}" >> "$OUT/fp8_ops.md" 2>&1; echo "rc=$?"
  kill $sp 2>/dev/null; wait $sp 2>/dev/null
  tail -45 "$OUT/fp8_ops.md"
fi

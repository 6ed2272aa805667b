#!/usr/bin/env bash
# LoRA on the lent H200 (run from the repository root with the device bundle in .device/, like
# device_session.sh): the GPU tests of LoRA and frozen weights, then bench_throughput runs.
#   DO_TESTS=1  CUDA tests of the adapter ops, dequantization, frozen groups and PEFT parity
#   DO_8B=1     LLaMA-3.1-8B shape, LoRA r=32 on all linears, 8 x 4096 tokens, M=8, cap CAP_8B
#               GiB, base in each of FORMATS_8B (default "bf16 q8_0 nf4")
#   DO_70B=1    LLaMA-3.1-70B shape, LoRA r=32, base FORMAT_70B (nf4), cap 24 GiB
#   DO_LONG=1   LLaMA-3.1-8B, one sequence of each of LONG_SEQS tokens, cap 24 GiB
# Results: $OUT/lora.md (one markdown row per run) and $OUT/lora.log.
set -uo pipefail
cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${cudnn_lib:+$cudnn_lib:}${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/lora.log") 2>&1
[ -n "${RP_BUILD_SRC:-}" ] && mkdir -p "$(dirname "$RP_BUILD_SRC")" && ln -sfn "$PWD" "$RP_BUILD_SRC"
step() { echo "=== $* ($(date +%T))"; }
res=$OUT/lora.md
bench() { timeout "${BENCH_TIMEOUT:-300}" .device/bin/bench_throughput --workers 1 --results "$res" "$@"; }
if [ "${DO_TESTS:-0}" = 1 ]; then
  step tests
  .device/bin/test_kernels --gtest_brief=1 --gtest_filter='*Lora*:Shapes/CudaRMSNorm.*:Out/CudaDequant.*' 2>&1 | tail -8
  .device/bin/test_model --gtest_brief=1 --gtest_filter='Lora*:LayerGrad.*' 2>&1 | tail -8
  .device/bin/test_actors --gtest_brief=1 --gtest_filter='RuntimeCuda.*:FrozenGroups.*' 2>&1 | tail -8
fi
if [ "${DO_8B:-0}" = 1 ]; then
  for f in ${FORMATS_8B:-bf16 q8_0 nf4}; do
    step "LLaMA-3.1-8B LoRA r=32, base $f, cap ${CAP_8B:-6}"
    bench --preset llama3.1-8b --lora-r 32 --base-format "$f" --seq 4096 --seqs 8 --micro 8 \
      --steps "${STEPS:-4}" --warmup 2 --cap-gib "${CAP_8B:-6}" ${BENCH_ARGS:-}
  done
fi
if [ "${DO_70B:-0}" = 1 ]; then
  step "LLaMA-3.1-70B LoRA r=32, base ${FORMAT_70B:-nf4}, cap 24"
  BENCH_TIMEOUT=${TIMEOUT_70B:-420} bench --preset llama3.1-70b --lora-r 32 --base-format "${FORMAT_70B:-nf4}" \
    --seq "${SEQ_70B:-4096}" --seqs 8 --micro 8 --steps "${STEPS_70B:-2}" --warmup 1 --cap-gib 24
fi
if [ "${DO_LONG:-0}" = 1 ]; then
  for s in ${LONG_SEQS:-49152 65536}; do
    step "LLaMA-3.1-8B LoRA r=32, one sequence of $s tokens, cap 24"
    bench --preset llama3.1-8b --lora-r 32 --base-format "${FORMAT_LONG:-bf16}" --seq "$s" --seqs 1 --micro 1 \
      --steps 1 --warmup 1 --cap-gib 24
  done
fi
step done

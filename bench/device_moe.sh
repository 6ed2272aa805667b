#!/usr/bin/env bash
# Mixture of experts (Qwen3-MoE) on the lent H200 (run from the repository root with the device
# bundle in .device/, like device_lora.sh): bench_throughput with random weights, LoRA r=32 on
# all linears (attention only in sparse layers), 8 x 4096 tokens, M=8.
#   DO_30B=1    Qwen3-30B-A3B, cap CAP_30B GiB (10), base in each of FORMATS_30B ("bf16 nf4")
#   TARGETS_30B the 30B rows' --lora-targets (all-linear; "q_proj,k_proj,v_proj,o_proj,experts"
#               for the row "LoRA r=32 on attention + experts": per-expert adapters on
#               gate_up_proj and down_proj of every sparse layer)
#   DO_235B=1   Qwen3-235B-A22B with its first LAYERS_235B (8) decoders, cap 24 GiB, base
#               FORMAT_235B (nf4)
#   DO_GPTOSS=1 GPT-OSS-20B, cap CAP_GPTOSS GiB (10), base in each of FORMATS_GPTOSS
#               ("bf16 mxfp4"; mxfp4 = experts in the checkpoint's MXFP4, the rest bf16)
# Results: $OUT/moe.md (one markdown row per run) and $OUT/moe.log; set them against the
# planner's predictions in bench/results/moe.md (roundpipe plan, same shapes).
set -uo pipefail
cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${cudnn_lib:+$cudnn_lib:}${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/moe.log") 2>&1
step() { echo "=== $* ($(date +%T))"; }
res=$OUT/moe.md
bench() { timeout "${BENCH_TIMEOUT:-420}" .device/bin/bench_throughput --workers 1 --results "$res" "$@"; }
if [ "${DO_30B:-0}" = 1 ]; then
  for f in ${FORMATS_30B:-bf16 nf4}; do
    step "Qwen3-30B-A3B LoRA r=32 on ${TARGETS_30B:-all-linear}, base $f, cap ${CAP_30B:-10}"
    bench --preset qwen3-30b-a3b --lora-r 32 --lora-targets "${TARGETS_30B:-all-linear}" --base-format "$f" --seq 4096 --seqs 8 \
      --micro 8 --steps "${STEPS:-4}" --warmup 2 --cap-gib "${CAP_30B:-10}" ${BENCH_ARGS:-}
  done
fi
if [ "${DO_235B:-0}" = 1 ]; then
  step "Qwen3-235B-A22B (${LAYERS_235B:-8} layers) LoRA r=32, base ${FORMAT_235B:-nf4}, cap 24"
  bench --preset qwen3-235b-a22b --layers "${LAYERS_235B:-8}" --lora-r 32 --base-format "${FORMAT_235B:-nf4}" \
    --seq 4096 --seqs 8 --micro 8 --steps "${STEPS:-3}" --warmup 1 --cap-gib 24 ${BENCH_ARGS:-}
fi
if [ "${DO_GPTOSS:-0}" = 1 ]; then
  for f in ${FORMATS_GPTOSS:-bf16 mxfp4}; do
    step "GPT-OSS-20B LoRA r=32, base $f, cap ${CAP_GPTOSS:-10}"
    bench --preset gpt-oss-20b --lora-r 32 --lora-targets all-linear --base-format "$f" --seq 4096 --seqs 8 \
      --micro 8 --steps "${STEPS:-4}" --warmup 2 --cap-gib "${CAP_GPTOSS:-10}" ${BENCH_ARGS:-}
  done
fi
step done

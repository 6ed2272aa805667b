#!/usr/bin/env bash
# On the lent GPU machine: single-sequence runs at the long-context targets of a 24 GiB card
# (each worker's pool capped at --cap-gib 24, as an RTX 4090 holds), one step measured after one
# warm-up step (a 262K-token step of Qwen3-1.7B takes over a minute), with nvidia-smi power and
# SM clock sampled beside each run, and the planner's prediction of the same run printed first.
# Expects the bundle in .device/ (bin/bench_throughput, bin/roundpipe, lib/); writes under $OUT.
#   CASES="preset:tokens:extra-args;..." bench/device_long_targets.sh
set -uo pipefail
cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${cudnn_lib:+$cudnn_lib:}${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
res=$OUT/long_targets.md
echo "| system | tokens/s | MFU | peak GPU GiB | host max RSS GiB | step s |" > "$res"; echo "|---|---|---|---|---|---|" >> "$res"
CASES=${CASES:-"qwen3-1.7b:262144:;llama3.1-8b:131072:--lora-r 32;qwen3-30b-a3b:65536:--lora-r 32 --lora-targets q_proj,k_proj,v_proj,o_proj"}
IFS=';' read -ra cases <<< "$CASES"
declare -A cfg=([qwen3-1.7b]=examples/configs/qwen3-1.7b.json [llama3.1-8b]=examples/configs/llama-3.1-8b.json
                [qwen3-30b-a3b]=examples/configs/qwen3-30b-a3b.json)
for c in "${cases[@]}"; do
  IFS=: read -r preset seq extra <<< "$c"
  echo "=== $preset $seq tokens $extra ($(date +%T))"
  # shellcheck disable=SC2086
  .device/bin/roundpipe plan --model "${cfg[$preset]}" --gpus 1 --micro 1 --seq "$seq" --memory-cap 24GiB $extra 2>&1 |
    grep -E "^iteration|peak|host|error" | head -6
  smi=$OUT/smi_${preset}_${seq}.csv
  nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,memory.used --format=csv,noheader -lms 500 > "$smi" &
  sp=$!
  # shellcheck disable=SC2086
  timeout ${LONG_TIMEOUT:-280} .device/bin/bench_throughput --workers 1 --preset "$preset" --cap-gib 24 --seq "$seq" \
    --seqs 1 --micro 1 --steps 1 --warmup 1 --results "$res" $extra 2>&1 | grep -vE "^step " | tail -8
  echo "rc=${PIPESTATUS[0]}"
  kill $sp 2>/dev/null; wait $sp 2>/dev/null
  awk -F', ' '{gsub(/ W/,"",$2); gsub(/ MHz/,"",$3); if ($2+0 > 100) {n++; p+=$2; c+=$3}} END {if (n) printf "power mean %.0f W, SM clock mean %.0f MHz over %d busy samples\n", p/n, c/n, n}' "$smi"
done
cat "$res"

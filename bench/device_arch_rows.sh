#!/usr/bin/env bash
# On the lent GPU machine: how much of the speed comes from Hopper-only code. The same
# bench_throughput rows from an sm_90 build (.device/bin/bench_throughput) and from a generic
# compute_80 PTX build (.device-arch80/bin/bench_throughput, every `__CUDA_ARCH__ >= 900` branch
# compiled out, JIT-compiled by the driver), alternating, with nvidia-smi power and SM clock
# sampled beside each run. Writes $OUT/arch_rows.md.
#   STEPS=8 bash bench/device_arch_rows.sh
#   GENERIC=.device-arch89   the generic bundle to compare (default .device-arch80)
set -uo pipefail
cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-/tmp/rp-jit-cache}
res=$OUT/arch_rows.md
echo "| system | tokens/s | MFU | peak GPU GiB | host max RSS GiB | step s |" > "$res"; echo "|---|---|---|---|---|---|" >> "$res"
rows=("--preset qwen3-1.7b --seq 8192 --seqs 8 --micro 8 --cap-gib 6.7"
      "--preset llama3.1-8b --seq 4096 --seqs 8 --micro 8 --cap-gib 6 --lora-r 32")
[ -n "${ROWS:-}" ] && IFS=';' read -ra rows <<< "$ROWS"   # ROWS="args;args": other rows
for args in "${rows[@]}"; do
  for b in .device "${GENERIC:-.device-arch80}"; do
    echo "=== $b: $args ($(date +%T))"
    smi=$OUT/smi_$(echo "$b$args" | tr -cd 'a-z0-9' | cut -c1-40).csv
    nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm --format=csv,noheader -lms 500 > "$smi" &
    sp=$!
    echo "| build $b |  |  |  |  |  |" >> "$res"
    # shellcheck disable=SC2086
    LD_LIBRARY_PATH=$PWD/$b/lib:/usr/local/cuda/lib64:${cudnn_lib:+$cudnn_lib:}${LD_LIBRARY_PATH:-} \
      timeout "${RUN_TIMEOUT:-200}" "$b/bin/bench_throughput" --workers 1 --steps "${STEPS:-8}" --warmup 2 \
      --results "$res" $args 2>&1 | grep -E "RESULT|error|PTX"
    kill $sp 2>/dev/null; wait $sp 2>/dev/null
    awk -F', ' '{gsub(/ W/,"",$2); gsub(/ MHz/,"",$3); if ($2+0 > 300) {n++; p+=$2; c+=$3}} END {if (n) printf "power mean %.0f W, SM clock mean %.0f MHz over %d busy samples\n", p/n, c/n, n}' "$smi"
  done
done
cat "$res"

#!/usr/bin/env bash
# On the lent GPU machine: the GPU tests, the Qwen3-30B-A3B expert GEMM A/B (grouped against
# bucketed) and the disk tier's host-budget rows, each mode one after the other in one call.
# Run from the repository root; the bundles are carried xz-packed (a call carries 64 MiB):
#   .c1/a.tar.xz  bin/ (bench_throughput, roundpipe, bench_fp8_algos) + lib/      (bundle.sh output, tar cJf)
#   .c2/t.tar.xz  bin/ (test_kernels, test_model, test_actors, test_trainer, stripped)
# and unpacked once per machine into $RP_DEV (default /tmp/rp).
#   RP_BUILD_SRC=<source path of the build machine> bash bench/device_bucketed_tier.sh MODE...
# Modes:
#   gtest      the GPU tests: $FILTER first (default: the padded expert layout and bucketed GEMMs),
#              then every CUDA test of each test binary
#   gmoe       only the first part of gtest (the mixture-of-experts tests)
#   b30g b30b  Qwen3-30B-A3B LoRA r=32 on attention, fp8 base, 8 x 4096, M=8, cap 10 GiB, expert
#              GEMMs grouped (b30g) or bucketed (b30b); STEPS (8) measured after 2 warm-up steps
#   b30s       b30b with each grouped linear's batches spread over BSTREAMS (4) streams
#              (RP_CUDA_BUCKETED_STREAMS)
#   p30g p30b  the same under the kernel profiler (bench/kernel_profile.cpp): $OUT/prof_MODE.md
#   bog bob    GPT-OSS-20B LoRA r=32 all linears, mxfp4 base, 8 x 4096, M=8, cap 10 GiB, expert
#              GEMMs grouped (bog) or bucketed over 4 streams (bob); STEPS (8) after 2 warm-up steps
#   d17 d17w   Qwen3-1.7B full fine-tuning with FP8 linears, 8 x 8192, M=8, cap 6.7 GiB; d17 with
#              bf16 weight gradients, d17w with FP8 ones; STEPS (8) after 2 warm-up steps
#   d4 d4w     the same for Qwen3-4B at cap 7.3 GiB (PLAN: an explicit plan, JSON as in a spec's
#              "plan" key, for the d* modes)
#   opsab      bench_ops --filter $OPS (default: the norms, RoPE, q/k norm + RoPE, SwiGLU and the
#              residual add) with the one-pass q/k norm + RoPE, then with the separate kernels
#              (RP_CUDA_QK_NORM_ROPE=separate): $OUT/ops_fused.md, $OUT/ops_separate.md
#              (RP_CUDA_QK_NORM_ROPE=separate before any d* mode measures a row without it)
#   fp8blk     bench_fp8_algos (the heuristic's first algorithm per shape) with one scale per tensor,
#              then with 1 x 128 / 128 x 128 block scales, twice in turn: $OUT/fp8_tensor_N.md,
#              $OUT/fp8_blocks_N.md (what block scales, which producers could write in their own
#              epilogue, cost the GEMMs)
#   l8f        LLaMA-3.1-8B LoRA r=32 all linears, fp8 base, FP8 linears, 8 x 4096, M=8, cap 6 GiB
#   p8f        the same under the kernel profiler (its last 12 s): $OUT/prof_p8f.md
#   p17        Qwen3-1.7B full fine-tuning with FP8 linears, 8 x 8192, M=8, cap 6.7 GiB, under the
#              kernel profiler (its last 12 s): $OUT/prof_p17.md
#   p4         the same for Qwen3-4B at cap 7.3 GiB: $OUT/prof_p4.md
#   s8ram      LLaMA-3.1-8B LoRA r=32 all linears, nf4 base, 8 x 1024, cap 6 GiB, in RAM
#   s8bud      the same on the disk tier with a whole-run host budget of 8 GiB
#   s8spill    the same with the saved inputs of SPILL (8) layers in the tier's spill file
#   n30bud     Qwen3-30B-A3B LoRA r=32 on attention, nf4 base, 8 x 4096, cap 10, budget 16 GiB
#   s70bud     LLaMA-3.1-70B LoRA r=32 all linears, nf4 base, 8 x 1024, cap 24, budget 32 GiB
#   s235bud    Qwen3-235B-A22B's first LAYERS (8) decoders, LoRA r=32, nf4 base, 8 x 4096, cap 24,
#              budget BUD (8) GiB: the plan keeps 1.6 of its 11.1 GiB base resident and reads 18.6 GiB
#              per iteration: 2,299 tokens/s at 1.4 GB/s
#              KEEP=1 keeps the cache (q235_nf4_L<LAYERS>.cache) for the next call on a warm machine:
#              a deep cache (4.2 s a decoder to build there: 193 s for 46) is reused by the next
#              call with the same LAYERS, which then only trains (its start line says "reused";
#              46 decoders fill the volume's 64 GiB). LAYERS=max: as many decoders as
#              the free space of $TIER holds (1.304 GiB each in nf4, plus 0.65 GiB of embeddings
#              and head, 2 GiB left over)
#   s235fit    the deepest cache this call can build and the disk can hold: a 4-decoder run first
#              times the build per decoder, then LAYERS = the smaller of what the free space holds
#              and what the rest of CALL_S (560) seconds from the script's start builds, then as
#              many measured steps (1-8) as the time left holds; the cache is kept
#              (KEEP=1; no dd read-back, NODD=1) for a second call, `LAYERS=<printed> KEEP=1 ... s235bud`, which trains
#   s235ram    the same LAYERS with the base in RAM (the row the tier's is compared with)
# BT names another bench_throughput in $RP_DEV/bin (an A/B's baseline build) for the bench rows;
# XARGS adds arguments to each bench row (e.g. XARGS=--late-gradients).
# Every bench row samples nvidia-smi (power, SM clock) every 0.5 s beside it (mean of samples above
# 300 W) and, for a tier row, reads the cache file back with dd (O_DIRECT) right after.
# Results: $OUT/rows.md (one markdown row per run), $OUT/run.log.
set -uo pipefail
cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
RP_DEV=${RP_DEV:-/tmp/rp}
if [ ! -x "$RP_DEV/bin/bench_throughput" ]; then
  mkdir -p "$RP_DEV"
  for t in .c1/a.tar.xz .c2/t.tar.xz; do [ -f "$t" ] && tar xJf "$t" -C "$RP_DEV"; done
fi
export LD_LIBRARY_PATH=$RP_DEV/lib:/usr/local/cuda/lib64:${cudnn_lib:+$cudnn_lib:}${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
[ -n "${RP_BUILD_SRC:-}" ] && mkdir -p "$(dirname "$RP_BUILD_SRC")" && ln -sfn "$PWD" "$RP_BUILD_SRC"
step() { echo "=== $*${XARGS:+ $XARGS} ($(date +%T))"; }
res=$OUT/rows.md
TIER=${TIER:-/tmp/rptier}
gt() {  # PROGRAM FILTER
  step "$1 $2"
  [ -x "$RP_DEV/bin/$1" ] || { echo "missing $1"; return; }
  timeout "${TEST_TIMEOUT:-240}" "$RP_DEV/bin/$1" --gtest_brief=1 --gtest_filter="$2" > "$OUT/gt_$1.txt" 2>&1
  echo "rc=$?"
  grep -E "^\[  FAILED  \]|\[  PASSED  \]|\[  SKIPPED \]|tests ran|Failure" "$OUT/gt_$1.txt" | head -30
}
bench() {  # NAME ARGS...: one bench_throughput row with power and clock beside it
  local name=$1; shift
  step "$name: bench_throughput $*"
  nvidia-smi --query-gpu=power.draw,clocks.sm --format=csv,noheader,nounits -lms 500 > "$OUT/smi_$name.csv" &
  local sp=$!
  # shellcheck disable=SC2086  # XARGS: extra bench_throughput arguments, split on spaces
  timeout "${BENCH_TIMEOUT:-400}" "$RP_DEV/bin/${BT:-bench_throughput}" --workers 1 --results "$res" "$@" ${XARGS:-}
  echo "rc=$?"
  kill $sp 2>/dev/null; wait $sp 2>/dev/null
  awk -F', ' -v n="$name" '$1 > 300 {p += $1; c += $2; k++} END {if (k) printf "SMI %s: %.0f W / %.0f MHz over %d samples\n", n, p/k, c/k, k; else print "SMI " n ": no sample above 300 W"}' "$OUT/smi_$name.csv"
}
ddread() {  # FILE: its first 4 GiB read back with O_DIRECT, as the disk allows
  [ -f "$1" ] && dd if="$1" of=/dev/null bs=16M count=256 iflag=direct 2>&1 | tail -1
}
l8=(--preset llama3.1-8b --seq 1024 --seqs 8 --micro 8 --cap-gib 6 --lora-r 32 --lora-targets all-linear
    --base-format nf4 --steps "${STEPS:-8}" --warmup 2)
l8f=(--preset llama3.1-8b --seq 4096 --seqs 8 --micro 8 --cap-gib 6 --lora-r 32 --lora-targets all-linear
     --fp8 --base-format fp8)
q30=(--preset qwen3-30b-a3b --seq 4096 --seqs 8 --micro 8 --cap-gib 10 --lora-r 32
     --lora-targets q_proj,k_proj,v_proj,o_proj)
if [ "${LAYERS:-}" = max ]; then
  mkdir -p "$TIER"
  free_kib=$(df -k --output=avail "$TIER" | tail -1)
  LAYERS=$(awk -v k="$free_kib" 'BEGIN { n = int((k / 1048576 - 0.65 - 2) / 1.304); print (n < 1 ? 1 : n) }')
  echo "LAYERS=max: $((free_kib / 1048576)) GiB free in $TIER, so $LAYERS decoders"
fi
q235=(--preset qwen3-235b-a22b --layers "${LAYERS:-8}" --seq 4096 --seqs 8 --micro 8 --cap-gib 24 --lora-r 32
      --base-format nf4 --steps "${STEPS:-2}" --warmup 1)
for mode in "$@"; do
  case $mode in
    gmoe|gtest)
      gt test_kernels "${FILTER:-*CudaMoePad*:MoePad*:MoePadded*}"
      gt test_model "LoraExpertsPeft.*:MoePadded*"
      gt test_actors "MoeRuntime*:StageMemoryMoe*"
      [ "$mode" = gmoe ] && continue
      gt test_kernels "*Cuda*:*Fp8*:DeviceArch.*:*F16*:OpTable*"
      gt test_model "*Cuda*:HfParity*:LoraPeft*:LoraExpertsPeft*"
      gt test_actors "*Cuda*:MemoryFlat*:Profil*:FrozenSource*"
      gt test_trainer "*Cuda*:*Fp8*"
      ;;
    b30g|b30b)
      eg=grouped; [ "$mode" = b30b ] && eg=bucketed
      bench "$mode" "${q30[@]}" --base-format fp8 --steps "${STEPS:-8}" --warmup 2 --expert-gemm "$eg" ;;
    b30s)
      RP_CUDA_BUCKETED_STREAMS=${BSTREAMS:-4} \
        bench "$mode" "${q30[@]}" --base-format fp8 --steps "${STEPS:-8}" --warmup 2 --expert-gemm bucketed ;;
    p30g|p30b)  # the same under the kernel profiler (bench/kernel_profile.cpp), its last 12 s
      eg=grouped; [ "$mode" = p30b ] && eg=bucketed
      CUDA_INJECTION64_PATH=$RP_DEV/lib/librp_kernel_profile.so RP_KPROF_OUT=$OUT/prof_$mode.md RP_KPROF_LAST_S=12 \
        RP_KPROF_CALLERS=cudaEventSynchronize,cudaStreamSynchronize,cudaMemcpy \
        bench "$mode" "${q30[@]}" --base-format fp8 --steps "${STEPS:-4}" --warmup 2 --expert-gemm "$eg" ;;
    bog|bob)
      eg=grouped; [ "$mode" = bob ] && eg=bucketed
      bench "$mode" --preset gpt-oss-20b --seq 4096 --seqs 8 --micro 8 --cap-gib 10 --lora-r 32 \
        --lora-targets all-linear --base-format mxfp4 --steps "${STEPS:-8}" --warmup 2 --expert-gemm "$eg" ;;
    d17|d17w|d4|d4w)
      wg=(--bf16-wgrad); [ "${mode%w}" != "$mode" ] && wg=(--fp8-wgrad)
      if [ "${mode#d17}" != "$mode" ]; then dense=(--preset qwen3-1.7b --cap-gib 6.7); else dense=(--preset qwen3-4b --cap-gib 7.3); fi
      bench "$mode" "${dense[@]}" --seq 8192 --seqs 8 --micro 8 --fp8 "${wg[@]}" --steps "${STEPS:-8}" --warmup 2 \
        ${PLAN:+--plan "$PLAN"} ;;
    opsab)
      for how in fused separate; do
        step "bench_ops ($how)"
        RP_CUDA_QK_NORM_ROPE=$how timeout 300 "$RP_DEV/bin/bench_ops" \
          --filter "${OPS:-rmsnorm,rope,qk_norm_rope,swiglu,add_residual}" --out "$OUT/ops_$how.md" 2>&1 | tail -30
      done ;;
    fp8blk)
      for n in 1 2; do
        for how in tensor blocks; do
          step "bench_fp8_algos ($how, $n)"
          timeout 300 "$RP_DEV/bin/bench_fp8_algos" --algos 1 --reps 10 $([ $how = blocks ] && echo --block-scales) \
            --out "$OUT/fp8_${how}_$n.md" 2>&1 | tail -3
        done
      done ;;
    l8f) bench l8f "${l8f[@]}" --steps "${STEPS:-8}" --warmup 2 ;;
    p8f)
      CUDA_INJECTION64_PATH=$RP_DEV/lib/librp_kernel_profile.so RP_KPROF_OUT=$OUT/prof_p8f.md RP_KPROF_LAST_S=12 \
        bench p8f "${l8f[@]}" --steps "${STEPS:-8}" --warmup 2 ;;
    p17)
      CUDA_INJECTION64_PATH=$RP_DEV/lib/librp_kernel_profile.so RP_KPROF_OUT=$OUT/prof_p17.md RP_KPROF_LAST_S=12 \
        bench p17 --preset qwen3-1.7b --seq 8192 --seqs 8 --micro 8 --cap-gib 6.7 --fp8 --steps "${STEPS:-8}" --warmup 2 ;;
    p4)
      CUDA_INJECTION64_PATH=$RP_DEV/lib/librp_kernel_profile.so RP_KPROF_OUT=$OUT/prof_p4.md RP_KPROF_LAST_S=12 \
        bench p4 --preset qwen3-4b --seq 8192 --seqs 8 --micro 8 --cap-gib 7.3 --fp8 --steps "${STEPS:-8}" --warmup 2 ;;
    s8ram) bench s8ram "${l8[@]}" ;;
    s8bud)
      mkdir -p "$TIER"; bench s8bud "${l8[@]}" --frozen-tier "$TIER/l8b_nf4.cache" --tier-host-budget-gib 8
      ddread "$TIER/l8b_nf4.cache" ;;
    s8spill)
      mkdir -p "$TIER"; bench s8spill "${l8[@]}" --frozen-tier "$TIER/l8b_nf4.cache" --tier-spill-layers "${SPILL:-8}"
      ddread "$TIER/l8b_nf4.cache" ;;
    n30bud)
      mkdir -p "$TIER"; bench n30bud "${q30[@]}" --base-format nf4 --steps "${STEPS:-4}" --warmup 1 \
        --frozen-tier "$TIER/q30_nf4.cache" --tier-host-budget-gib 16
      ddread "$TIER/q30_nf4.cache"; rm -f "$TIER/q30_nf4.cache" ;;
    s70bud)
      mkdir -p "$TIER"; rm -f "$TIER"/l8b_nf4.cache
      bench s70bud --preset llama3.1-70b --seq 1024 --seqs 8 --micro 8 --cap-gib 24 --lora-r 32 --lora-targets all-linear \
        --base-format nf4 --steps "${STEPS:-2}" --warmup 1 --frozen-tier "$TIER/l70b_nf4.cache" --tier-host-budget-gib 32
      ddread "$TIER/l70b_nf4.cache"; rm -f "$TIER/l70b_nf4.cache" ;;
    s235ram) bench s235ram "${q235[@]}" ;;
    s235bud)
      mkdir -p "$TIER"
      bench s235bud "${q235[@]}" --frozen-tier "$TIER/q235_nf4_L${LAYERS:-8}.cache" --tier-host-budget-gib "${BUD:-8}"
      [ -n "${NODD:-}" ] || ddread "$TIER/q235_nf4_L${LAYERS:-8}.cache"
      [ -n "${KEEP:-}" ] || rm -f "$TIER/q235_nf4_L${LAYERS:-8}.cache" ;;
    s235fit)
      mkdir -p "$TIER"
      LAYERS=4 STEPS=1 KEEP= BUD=8 bash "$0" s235bud > /dev/null
      per=$(grep -o 'q235_nf4_L4.cache: built ([0-9.]* GiB, [0-9.]* s' "$OUT/run.log" | tail -1 | awk '{print $(NF-1) / 4.5}')
      free_kib=$(df -k --output=avail "$TIER" | tail -1)
      by_disk=$(awk -v k="$free_kib" 'BEGIN { print int((k / 1048576 - 0.65 - 2) / 1.304) }')
      left=$(( ${CALL_S:-560} - SECONDS - 40 ))
      by_time=$(awk -v l="$left" -v p="$per" 'BEGIN { print (p > 0 ? int(0.85 * l / p) : 0) }')
      fit=$(( by_disk < by_time ? by_disk : by_time ))
      echo "s235fit: build ${per} s per decoder, ${left} s left, disk holds ${by_disk}, time allows ${by_time}: LAYERS=${fit}"
      # the steps the rest of the call holds after the build: an iteration reads ~1.7 s a decoder
      # at ~1.3 GB/s (46 decoders: 78.6 s), and the warm-up step and the last step's drain take
      # about one iteration each. With none left the run still starts: the call's limit stops it
      # once the cache is written and kept (the second call measures)
      steps=$(awk -v l="$left" -v p="$per" -v n="$fit" 'BEGIN { s = int((l - n * p - 60) / (n * 1.7)) - 2; print (s < 1 ? 1 : (s > 8 ? 8 : s)) }')
      echo "s235fit: $steps measured steps after the build"
      [ "$fit" -ge 1 ] && LAYERS=$fit STEPS=$steps KEEP=1 BUD=${BUD:-32} BENCH_TIMEOUT=$left NODD=1 bash "$0" s235bud > /dev/null
      ls -la "$TIER" ;;
    *) echo "unknown mode $mode" ;;
  esac
done
step done
[ -f "$res" ] && cat "$res"

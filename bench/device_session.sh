#!/usr/bin/env bash
# One batched session on the lent GPU machine (see docs/gpu.md): golden fixtures from
# transformers, GPU tests, then throughput (RoundPipe vs resident PyTorch) and scaling.
# Expects the bundle in .device/ (bin/ + lib/); writes everything under $OUT.
set -uo pipefail
# cuDNN on the lent machine comes with PyTorch's wheels (nvidia-cudnn-cu13), not the toolkit
cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${cudnn_lib:+$cudnn_lib:}${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log=$OUT/session.log
exec > >(tee -a "$log") 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
nproc; free -g | head -2
echo "cuDNN: ${cudnn_lib:-not found} $(ls ${cudnn_lib:-/nonexistent} 2>/dev/null | grep -m1 'libcudnn.so.9')"
# the tests look for fixtures at the build machine's source path
mkdir -p "$(dirname "$RP_BUILD_SRC")" && ln -sfn "$PWD" "$RP_BUILD_SRC"
step() { echo "=== $* ($(date +%T))"; }
if [ "${DO_GOLDEN:-1}" = 1 ]; then
  step golden
  python3 tests/fixtures/hf_golden/make_golden.py tests/fixtures/hf_golden
  tar czf "$OUT/golden.tgz" tests/fixtures/hf_golden
fi
if [ "${DO_TESTS:-1}" = 1 ]; then
  step tests
  .device/bin/test_kernels --gtest_brief=1 2>&1 | tail -5
  .device/bin/test_model --gtest_filter='HfParity*' 2>&1 | tail -25
  .device/bin/test_actors --gtest_filter='*Cuda*' 2>&1 | tail -25
fi
if [ "${DO_OPS:-0}" = 1 ]; then
  step per-op benchmark
  .device/bin/bench_ops --out "$OUT/ops.md" ${OPS_ARGS:-} > "$OUT/ops.txt" 2>&1; tail -40 "$OUT/ops.txt"
fi
if [ "${DO_BENCH:-1}" = 1 ]; then
  res=$OUT/throughput.md
  echo "| system | tokens/s | MFU | peak GPU GiB | host max RSS GiB | step s |" > "$res"; echo "|---|---|---|---|---|---|" >> "$res"
  # REPEAT runs of the same command (the first one traced): the ratio below uses their median
  for r in $(seq 1 "${REPEAT:-1}"); do
    step "roundpipe 1 GPU, run $r of ${REPEAT:-1}"
    tr=(); [ "$r" = 1 ] && tr=(--trace "$OUT/trace_1gpu.json")
    timeout 300 .device/bin/bench_throughput --workers 1 --results "$res" "${tr[@]}" ${BENCH_ARGS:-}
  done
  # BENCH_ARGS2: a variant (another plan, say), REPEAT2 runs of it
  for r in $(seq 1 "${REPEAT2:-0}"); do
    step "roundpipe 1 GPU, variant run $r of ${REPEAT2:-0}"
    timeout 300 .device/bin/bench_throughput --workers 1 --results "$res" ${BENCH_ARGS2:-}
  done
  if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
    step roundpipe 2 GPUs
    timeout 240 .device/bin/bench_throughput --workers 2 --results "$res" --trace "$OUT/trace_2gpu.json" ${BENCH_ARGS:-}
  fi
  if [ "${DO_PT:-1}" = 1 ]; then
    step pytorch
    PYTHONUNBUFFERED=1 timeout 240 python3 bench/pytorch_baseline.py --results "$res" ${PT_ARGS:-}
    # the ratio of the median of the first REPEAT RoundPipe rows to the PyTorch row of this run
    python3 - "$res" "${REPEAT:-1}" <<'PY'
import statistics, sys
rows = [l.split("|") for l in open(sys.argv[1]) if l.startswith("| ")][1:]
rp = [float(r[2]) for r in rows if "roundpipe" in r[1]][: int(sys.argv[2])]
pt = [float(r[2]) for r in rows if "pytorch" in r[1]]
if rp and pt:
    med = statistics.median(rp)
    print(f"RATIO roundpipe / pytorch resident tokens/s = {med / pt[0]:.2f} (median of {len(rp)} RoundPipe runs: {med:.0f})")
PY
  fi
  cat "$res"
fi
if [ "${DO_PRIO:-0}" = 1 ]; then
  # transfer priorities: the benchmark with cross-stream priorities + chunking on, then both off, each
  # traced, and the traces' statistics side by side (compute utilisation, activation-upload
  # waits vs one chunk, copy time hidden under compute, bytes per stream).
  # PRIO_GPUS="1 2" for both GPU counts; CHUNK_BYTES for the "on" run (default 32 MiB);
  # SKIP_PASSES warm-up passes left out of the statistics (default 2 = the default --warmup).
  res=$OUT/priorities.md
  echo "| system | tokens/s | MFU | peak GPU GiB | host max RSS GiB | step s |" > "$res"; echo "|---|---|---|---|---|---|" >> "$res"
  for g in ${PRIO_GPUS:-1}; do
    [ "$(nvidia-smi -L | wc -l)" -ge "$g" ] || continue
    step "priorities + chunking on, $g GPU(s)"
    timeout 300 .device/bin/bench_throughput --workers "$g" --results "$res" --trace "$OUT/trace_prio_on_${g}gpu.json" \
      --chunk-bytes "${CHUNK_BYTES:-33554432}" ${BENCH_ARGS:-}
    step "priorities + chunking off, $g GPU(s)"
    timeout 300 .device/bin/bench_throughput --workers "$g" --results "$res" --trace "$OUT/trace_prio_off_${g}gpu.json" \
      --no-priorities --chunk-bytes 0 ${BENCH_ARGS:-}
    step "trace statistics, $g GPU(s)"
    .device/bin/roundpipe trace --skip-passes "${SKIP_PASSES:-2}" --chunk-bytes "${CHUNK_BYTES:-33554432}" --json "$OUT/trace_stats_${g}gpu.json" \
      "$OUT/trace_prio_on_${g}gpu.json" "$OUT/trace_prio_off_${g}gpu.json"  # the text goes to session.log
  done
  cat "$res"
fi
if [ "${DO_GQA:-0}" = 1 ]; then
  # grouped-query attention backward through cuDNN: the native path's probe, the kernel tests,
  # and the per-ratio rows of the op benchmark
  step "cuDNN GQA probe"
  timeout 240 .device/bin/bench_cudnn_gqa_probe ${PROBE_ARGS:---quick} > "$OUT/gqa_probe.txt" 2>&1; tail -40 "$OUT/gqa_probe.txt"
  step "attention op benchmark"
  timeout 300 .device/bin/bench_ops --filter attention_gqa_,gqa_ --out "$OUT/ops_gqa.md" ${OPS_ARGS:-} 2>&1 | tail -40
fi
if [ "${DO_MODELS:-0}" = 1 ]; then
  # MODEL_CASES: "preset:cap_gib[:extra bench flags with commas for spaces]" rows of the
  # 8 x 8192-token, M=8 benchmark (automatic plan unless the extra flags give one)
  res=$OUT/models.md
  [ -s "$res" ] || { echo "| system | tokens/s | MFU | peak GPU GiB | host max RSS GiB | step s |" > "$res"; echo "|---|---|---|---|---|---|" >> "$res"; }
  for c in ${MODEL_CASES:-qwen3-1.7b:6.7 qwen3-4b:7.3}; do
    IFS=: read -r preset cap extra <<< "$c"
    step "model $preset, cap $cap GiB ${extra//,/ }"
    timeout ${MODEL_TIMEOUT:-240} .device/bin/bench_throughput --workers 1 --preset "$preset" --cap-gib "$cap" \
      --steps ${MODEL_STEPS:-4} --warmup 2 --results "$res" ${extra//,/ } 2>&1 | grep -v "^step "
  done
  cat "$res"
fi
if [ "${DO_LONG:-0}" = 1 ]; then
  # LONG_CASES: "preset:tokens:cap_gib" single-sequence runs (M=1); with PLAN_MAXSEQ=1 the
  # planner's longest sequence for each preset and cap is printed first
  res=$OUT/long.md
  [ -s "$res" ] || { echo "| system | tokens/s | MFU | peak GPU GiB | host max RSS GiB | step s |" > "$res"; echo "|---|---|---|---|---|---|" >> "$res"; }
  for c in ${LONG_CASES:-qwen3-1.7b:65536:24 qwen3-1.7b:131072:24}; do
    IFS=: read -r preset seq cap <<< "$c"
    if [ "${PLAN_MAXSEQ:-0}" = 1 ]; then
      .device/bin/roundpipe plan --model "bench/configs/$preset.json" --gpus 1 --micro 1 --memory-cap "${cap}GiB" --max-seq 2>&1 | grep -E "longest|error"
    fi
    step "long sequence $preset $seq tokens, cap $cap GiB"
    timeout ${LONG_TIMEOUT:-300} .device/bin/bench_throughput --workers 1 --preset "$preset" --cap-gib "$cap" --seq "$seq" \
      --seqs 1 --micro 1 --steps 1 --warmup 1 --results "$res" 2>&1 | grep -v "^step "
  done
  cat "$res"
fi
if [ "${DO_MAXSEQ:-0}" = 1 ]; then
  # MAXSEQ_CASES: "preset:cap_gib": the planner's longest sequence under the cap
  # (`roundpipe plan --max-seq`), then a real run of one sequence of that length under it
  res=$OUT/maxseq.md
  [ -s "$res" ] || { echo "| system | tokens/s | MFU | peak GPU GiB | host max RSS GiB | step s |" > "$res"; echo "|---|---|---|---|---|---|" >> "$res"; }
  for c in ${MAXSEQ_CASES:-qwen3-1.7b:8}; do
    IFS=: read -r preset cap <<< "$c"
    n=$(.device/bin/roundpipe plan --model "bench/configs/$preset.json" --gpus 1 --micro 1 --memory-cap "${cap}GiB" \
         --max-seq 2>&1 | sed -n 's/^longest *\([0-9]*\) tokens.*/\1/p')
    step "planner's longest sequence for $preset under $cap GiB: ${n:-none}; a real run of it"
    [ -n "$n" ] && timeout ${LONG_TIMEOUT:-300} .device/bin/bench_throughput --workers 1 --preset "$preset" --cap-gib "$cap" \
      --seq "$n" --seqs 1 --micro 1 --steps 1 --warmup 1 --results "$res" 2>&1 | grep -v "^step "
  done
  cat "$res"
fi
step done

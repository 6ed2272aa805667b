#!/usr/bin/env bash
# On the lent GPU machine: the loss-curve check of FP8 linears ("fp8": true) on a real model.
# The default job's model and data (SmolLM2-135M-Instruct's pretrained weights, the King James
# passages) on the CUDA backend for STEPS steps (default 200), synchronous optimizer (so the
# one-step staleness does not mix in), with enough passages that the run does not memorise them
# (MAX_EXAMPLES, default 4000, 5% held out and evaluated every 20 steps; 8 sequences of 128
# tokens per step). Runs (RUNS, default "full_bf16 full_fp8 lora_bf16 lora_fp8"): full
# fine-tuning (examples/specs/default.json) and LoRA (examples/specs/lora.json), each with bf16
# linears (the reference) and with FP8 linears; full_fp8w adds FP8 weight gradients
# ("fp8_weight_gradients": true).
# Expects the bundle in .device/ (bin/roundpipe, lib/) and assets/ (setup.sh fetches them).
# Writes each run's log and metrics.csv under $OUT; compare them with
#   bench/loss_curve_table.py $OUT full_bf16 full_fp8   (and lora_bf16 lora_fp8)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${cudnn_lib:+$cudnn_lib:}${LD_LIBRARY_PATH:-}
for name in ${RUNS:-full_bf16 full_fp8 lora_bf16 lora_fp8}; do
  kind=${name%%_*} prec=${name#*_}
  spec=$([ "$kind" = lora ] && echo lora || echo default)
  fp8=$([ "$prec" = bf16 ] && echo false || echo true)
  wgrad=$([ "$prec" = fp8w ] && echo true || echo false)
  extra=(); [ "$kind" = lora ] && extra=(--set merge_adapters=false)
  d=$(mktemp -d)/run
  /usr/bin/time -f "%e s wall, max RSS %M KB" .device/bin/roundpipe -q train "examples/specs/$spec.json" \
    --set backend=cuda --set workers=1 --set fp8="$fp8" --set fp8_weight_gradients="$wgrad" --set steps="${STEPS:-200}" --set async=false \
    --set eval_every=20 --set max_examples="${MAX_EXAMPLES:-4000}" --set eval_fraction=0.05 \
    --set sequences_per_step=8 "${extra[@]}" --output-dir "$d" > "$OUT/fp8f_$name.log" 2>&1
  echo "$name: rc=$? $(tail -1 "$OUT/fp8f_$name.log")"
  cp "$d/metrics.csv" "$OUT/metrics_$name.csv" 2>/dev/null
  rm -rf "$(dirname "$d")"
done

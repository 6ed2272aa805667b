#!/usr/bin/env bash
# On the lent GPU machine: the loss-curve check of fp16 accumulation ("gemm_accumulate": "f16").
# The default job (examples/specs/default.json: SmolLM2-135M-Instruct, the real pretrained weights,
# on the King James passages) on the CUDA backend for STEPS steps (default 200), synchronous
# optimizer, evaluation every 20 steps, three times: bf16 compute (the reference), f16 compute
# with fp32 accumulation, f16 compute with fp16 accumulation. Expects the bundle in .device/
# (bin/roundpipe, lib/) and assets/ (the model and data; setup.sh fetches them). Writes each
# run's log and metrics.csv under $OUT; compare them with bench/fp16_accumulation_table.py.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
cudnn_lib=$(python3 -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH=$PWD/.device/lib:/usr/local/cuda/lib64:${cudnn_lib:+$cudnn_lib:}${LD_LIBRARY_PATH:-}
for v in "bf16 f32" "f16 f32" "f16 f16"; do
  read -r dtype acc <<< "$v"
  d=$(mktemp -d)/run
  /usr/bin/time -f "%e s wall, max RSS %M KB" .device/bin/roundpipe -q train examples/specs/default.json \
    --set backend=cuda --set workers=1 --set compute_dtype="$dtype" --set gemm_accumulate="$acc" \
    --set steps="${STEPS:-200}" --set async=false --set eval_every=20 --output-dir "$d" > "$OUT/fp16c_${dtype}_$acc.log" 2>&1
  echo "compute $dtype, accumulate $acc: rc=$? $(tail -1 "$OUT/fp16c_${dtype}_$acc.log")"
  cp "$d/metrics.csv" "$OUT/metrics_${dtype}_$acc.csv" 2>/dev/null
done

#!/usr/bin/env bash
# Sync vs staleness-1 async AdamW over a grid of peak learning rates, with and without
# warmup, on the default job (examples/specs/default.json: SmolLM2-135M, real weights from
# assets/) and the LoRA job (examples/specs/lora.json). Each grid point trains the same spec
# (same seed, data and batches) twice, "async": false and true, and the table compares the
# mean training loss of the final 20 steps and the held-out loss after the last step.
#
#   bench/async_lr_sweep.sh [--bin build/roundpipe] [--backend cpu|cuda] [--steps 100]
#       [--jobs "default lora"] [--lrs "1e-5 3e-5 1e-4 3e-4 1e-3 3e-3"] [--warmups "0 10"]
#       [--parallel 1] [--out bench/results/async_lr_sweep] [--tiny] [--async-extra JSON]
#
# --tiny      the tiny LLaMA of bench/tiny_model.py (written into OUT/tiny-model) and 16 KJV
#             passages as text (OUT/tiny-data.jsonl), 64-token sequences: a quick CPU check of
#             the script (minutes on 2 cores), not a measurement of the real jobs.
# --parallel  runs this many trainings at once (on one GPU: the runs are small, a few GiB each;
#             the CPU AdamW of each run wants a few cores).
# --async-extra  JSON object merged into the async specs only (e.g. an optimizer option to
#             compare against plain async).
# Output: OUT/<job>_lr<lr>_w<warmup>_<sync|async>/ (spec.json, run.log, metrics.csv; the
# checkpoints each run writes are removed when it ends), OUT/table.md and OUT/table.csv. A run
# whose folder holds `done` is not run again, so a grid can be split over several calls with
# the same OUT (e.g. --lrs "1e-5 3e-5 1e-4", then the rest) and the table covers all of them.
# Relative --bin and --out are relative to the current folder; the defaults to the repository.
set -euo pipefail
orig=$PWD
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$self")/.."
here=bench
abs() { case "$1" in /*) echo "$1" ;; *) echo "$orig/$1" ;; esac; }

if [ "${1:-}" = __run ]; then  # one training: __run RUN_DIR BIN
  dir=$2 bin=$3
  [ -f "$dir/done" ] && exit 0
  rm -f "$dir/metrics.csv"
  if "$bin" -q train "$dir/spec.json" > "$dir/run.log" 2>&1; then
    touch "$dir/done"
  else
    echo "run failed: $dir (see $dir/run.log: $(tail -n 1 "$dir/run.log"))" >&2
  fi
  # the run's own checkpoints (final/, state/, final-merged/): only the metrics are kept
  rm -rf "$dir/final" "$dir/state" "$dir/final-merged" "$dir/profile.json"
  exit 0
fi

bin=$PWD/build/roundpipe backend=cpu steps=100 jobs="default lora" lrs="1e-5 3e-5 1e-4 3e-4 1e-3 3e-3"
warmups="0 10" parallel=1 out=$PWD/bench/results/async_lr_sweep tiny=0 async_extra=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --lrs) lrs=$2; shift 2 ;;
    --warmups) warmups=$2; shift 2 ;;
    --parallel) parallel=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --tiny) tiny=1; shift ;;
    --async-extra) async_extra=$2; shift 2 ;;
    *) echo "async_lr_sweep.sh: unknown argument '$1' (see the comment at the top of the script)" >&2; exit 2 ;;
  esac
done
bin=$(abs "$bin") out=$(abs "$out")
[ -x "$bin" ] || { echo "async_lr_sweep.sh: --bin: '$bin' is not an executable roundpipe binary" >&2; exit 2; }
case "$backend" in cpu|cuda|auto) ;; *) echo "async_lr_sweep.sh: --backend: expected cpu, cuda or auto, got '$backend'" >&2; exit 2 ;; esac
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "async_lr_sweep.sh: --steps: expected an integer >= 1, got '$steps'" >&2; exit 2; }
[[ "$parallel" =~ ^[1-9][0-9]*$ ]] || { echo "async_lr_sweep.sh: --parallel: expected an integer >= 1, got '$parallel'" >&2; exit 2; }
mkdir -p "$out"
tiny_args=()
if [ "$tiny" = 1 ]; then
  [ -f "$out/tiny-model/config.json" ] || python3 $here/tiny_model.py "$out/tiny-model"
  [ -f "$out/tiny-data.jsonl" ] || python3 $here/async_lr_sweep.py text-data assets/kjv_instruct.jsonl "$out/tiny-data.jsonl" 16
  tiny_args=(--tiny-model "$out/tiny-model" --tiny-data "$out/tiny-data.jsonl")
fi

list=$out/.runs.$$
: > "$list"
for job in $jobs; do
  base=examples/specs/$job.json
  [ -f "$base" ] || { echo "async_lr_sweep.sh: --jobs: no spec $base" >&2; rm -f "$list"; exit 2; }
  for lr in $lrs; do
    for w in $warmups; do
      for mode in sync async; do
        dir=$out/${job}_lr${lr}_w${w}_${mode}
        mkdir -p "$dir"
        python3 $here/async_lr_sweep.py spec "$base" "$dir/spec.json" --lr "$lr" --warmup "$w" --steps "$steps" \
          --mode "$mode" --backend "$backend" --output-dir "$dir" --async-extra "$async_extra" "${tiny_args[@]}"
        echo "$dir" >> "$list"
      done
    done
  done
done
echo "async_lr_sweep: $(wc -l < "$list") runs of $steps steps, $parallel at a time, into $out ($(date -u +%H:%M:%S))"
xargs -P "$parallel" -I{} bash "$self" __run {} "$bin" < "$list"
rm -f "$list"
{
  echo "# Async vs sync AdamW over peak learning rates"
  echo
  echo "- command: \`bench/async_lr_sweep.sh --backend $backend --steps $steps --jobs \"$jobs\" --lrs \"$lrs\" --warmups \"$warmups\"$([ "$tiny" = 1 ] && echo ' --tiny')$([ -n "$async_extra" ] && echo " --async-extra '$async_extra'")\`"
  echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo '+dirty'); $(uname -srm), $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- loss = mean training loss of the final 20 steps (metrics.csv); eval = held-out loss after the last step; async - sync relative to sync"
  echo
} > "$out/header.md"
python3 $here/async_lr_sweep.py table "$out" > /dev/null
cat "$out/header.md" "$out/table.md" > "$out/README.md"
cat "$out/README.md"

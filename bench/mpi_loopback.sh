#!/usr/bin/env bash
# What summing the gradients over data-parallel replicas costs on one machine (loopback TCP,
# CPU backend): SmolLM2-135M full fine-tuning (135 M fp32 gradient values, 540 MB per step),
# seq 64, 6 passes of 1 sequence per step, one virtual GPU per process (little compute per
# step, so the sum's share shows).
#   - "N replicas": `mpirun -np N roundpipe train` (each replica runs 6/N passes per step);
#   - "N alone": N independent processes started together (`--mpi off`), each running the same
#     6/N passes per step with nothing summed: the same CPU contention without the reduction.
# The step time difference is what the reduction adds per step; bytes and the communication
# thread's busy time come from the run's own "replicas:" log line. "waited" is measured inside
# the run: metrics.csv's reduce_wait_s, the seconds a step's pipeline waited for its sums (the
# part the overlap with backward and the next step did not hide), median over steps 3.. of
# all but the last step (whose sums the run's end waits for, outside the pipeline).
# Writes bench/results/mpi.md. Usage: bench/mpi_loopback.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-6}
bin=${RP_BIN:-build/roundpipe}
out=bench/results/mpi.md
tmp=$(mktemp -d)
mpi="mpirun --oversubscribe --allow-run-as-root --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"
spec() {  # spec <accumulation> <sequences_per_step>
  python3 - "$1" "$2" "$steps" <<'PY'
import json, sys
a, s, steps = map(int, sys.argv[1:])
print(json.dumps({"model": "assets/SmolLM2-135M-Instruct.Q4_1.gguf", "data": "assets/kjv_instruct.jsonl",
                  "max_examples": 64, "seq_len": 64, "sequences_per_step": s, "micro_batches": 1,
                  "accumulation": a, "steps": steps, "backend": "cpu", "workers": 1, "tensorboard": False,
                  "save_dtype": "bf16", "optimizer": {"lr": 1e-4}}))
PY
}
# median step seconds over steps 3.. from metrics.csv: tokens of a step / tokens_per_s
step_s() {
  python3 - "$1" "$2" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
tokens = float(sys.argv[2])
print(f"{statistics.median(tokens / float(r['tokens_per_s']) for r in rows[2:]):.3f}")
PY
}
# median reduce_wait_s over steps 3..last-1 from metrics.csv (a run of replicas)
wait_s() {
  python3 - "$1" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
w = [float(r['reduce_wait_s']) for r in rows[2:-1]] or [float(r['reduce_wait_s']) for r in rows]
print(f"{statistics.median(w):.3f}")
PY
}
spec 6 6 > "$tmp/global.json"
{
  echo "# Data-parallel replicas over MPI on loopback (CPU backend)"
  echo
  echo "- command: \`bench/mpi_loopback.sh $steps\`"
  echo "- commit: $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')"
  echo "- machine: $(uname -srm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/{print $2}') GiB; $(mpirun --version | head -1)"
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- job: SmolLM2-135M full fine-tuning, seq 64, global batch 6 sequences = 6 passes x 1, one virtual GPU per process; $steps steps, step time = median over steps 3..$steps"
  echo "- the machine is shared (other jobs were compiling), so step times carry their noise; bytes are exact"
  echo
  echo "| processes | step s, N replicas | step s, N alone (same passes each, no sum) | added by the sum, s/step | MB summed per step | MB sent per replica per step | comm thread busy s/step | waited for the sum (exposed), s/step |"
  echo "|---|---|---|---|---|---|---|---|"
} > "$tmp/table.md"
$bin -q train "$tmp/global.json" --output-dir "$tmp/one" > "$tmp/log1" 2>&1
echo "| 1 | $(step_s "$tmp/one/metrics.csv" 384) | (same) | 0 | 0 | 0 | 0 | 0 |" >> "$tmp/table.md"
for n in 2 3; do
  $mpi -np "$n" "$bin" train "$tmp/global.json" --output-dir "$tmp/rep$n" > "$tmp/logr$n" 2>&1
  line=$(grep "replicas: .* gradient sums" "$tmp/logr$n" | head -1)
  mb=$(echo "$line" | sed -E 's/.* ([0-9.]+) MB summed per step.*/\1/')
  sent=$(echo "$line" | sed -E 's/.* ([0-9.]+) MB sent per step.*/\1/')
  busy=$(echo "$line" | sed -E 's/.* ([0-9.]+) s per step with a sum in flight.*/\1/')
  spec $((6 / n)) $((6 / n)) > "$tmp/share$n.json"
  pids=()
  for i in $(seq 1 "$n"); do
    $bin -q train "$tmp/share$n.json" --mpi off --output-dir "$tmp/alone$n-$i" > "$tmp/loga$n-$i" 2>&1 & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  r=$(step_s "$tmp/rep$n/metrics.csv" 384)
  a=$(python3 -c "import statistics,sys; print(f'{statistics.mean(float(x) for x in sys.argv[1:]):.3f}')" \
      $(for i in $(seq 1 "$n"); do step_s "$tmp/alone$n-$i/metrics.csv" $((384 / n)); done))
  echo "| $n | $r | $a | $(python3 -c "print(f'{$r-$a:.3f}')") | $mb | $sent | $busy | $(wait_s "$tmp/rep$n/metrics.csv") |" >> "$tmp/table.md"
done
{
  echo
  echo "## Predicted multi-node runs (roundpipe plan --nodes)"
  echo
  echo "8 H200 per node (the planner's defaults: 790 TFLOP/s, PCIe 55 GB/s), 16 micro-batches of 8192 tokens per"
  echo "iteration, 100 Gbit/s per node, 10 us per message; the model in scheduler/replica_cost.hpp."
  echo "Command per row: \`roundpipe plan --model examples/configs/MODEL.json --gpus 8 --seq 8192 --micro 16 --nodes N --net-gbps 100 --accumulation A\`."
  echo
  echo "| model | nodes | accumulation | GiB sent per node per step | link s/step | compute s/step | async: exposed s, x one node | sync: exposed s, x one node |"
  echo "|---|---|---|---|---|---|---|---|"
  for m in qwen3-1.7b llama-3.1-8b; do
    for n in 2 4 8; do
      for a in 1 4; do
        "$bin" plan --model "examples/configs/$m.json" --gpus 8 --seq 8192 --micro 16 --nodes "$n" --net-gbps 100 \
          --accumulation "$a" > "$tmp/plan.txt"
        python3 - "$tmp/plan.txt" "$m" "$n" "$a" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
ms = lambda s: float(s) / 1e3
sent = re.search(r"sends and receives ([0-9.]+) GiB", t).group(1)
link = ms(re.search(r"GiB \(2 \(N-1\)/N of them\), ([0-9.]+) ms on the link", t).group(1))
comp = ms(re.search(r"compute ([0-9.]+) ms", t).group(1))
am = re.search(r"async: (?:the link cannot keep up, ([0-9.]+) ms exposed|hidden under the next step) -> step [0-9.]+ ms, [0-9]+ tokens/s over \d+ nodes \(([0-9.]+)x", t)
sm = re.search(r"sync:  ([0-9.]+) ms exposed .*\(([0-9.]+)x one node\)", t)
aexp = ms(am.group(1)) if am.group(1) else 0.0
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {sent} | {link:.3f} | {comp:.3f} | {aexp:.3f}, {am.group(2)}x | {ms(sm.group(1)):.3f}, {sm.group(2)}x |")
PY
      done
    done
  done
} >> "$tmp/table.md"
mv "$tmp/table.md" "$out"
rm -rf "$tmp"
cat "$out"

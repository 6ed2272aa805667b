#!/usr/bin/env bash
# Tokens/s of the default job (examples/specs/default.json: SmolLM2-135M, seq 128,
# 4 sequences per step, 2 micro-batches) on the CPU backend with 1, 2 and 4 virtual
# workers. Writes bench/results/default_job_cpu.md. Usage: bench/default_job_cpu.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-8}
out=bench/results/default_job_cpu.md
tmp=$(mktemp -d)
{
  echo "# Default job on the CPU backend"
  echo
  echo "- command: \`bench/default_job_cpu.sh $steps\` (each row: \`build/roundpipe train examples/specs/default.json --steps $steps --workers G\`)"
  echo "- commit: $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')"
  echo "- machine: $(uname -srm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "- date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "- tokens/s = median over steps 3..$steps of (4 sequences x 128 tokens) / step wall time, read from metrics.csv"
  echo
  echo "| workers | median tokens/s | total wall time (s) |"
  echo "|---|---|---|"
} > "$tmp/table.md"
for g in 1 2 4; do
  start=$(date +%s.%N)
  "${RP_BIN:-build/roundpipe}" -q train examples/specs/default.json --steps "$steps" --workers "$g" --output-dir "$tmp/run$g" > "$tmp/log$g" 2>&1
  end=$(date +%s.%N)
  med=$(python3 - "$tmp/run$g/metrics.csv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(f"{statistics.median(float(r['tokens_per_s']) for r in rows[2:]):.1f}")
PY
)
  echo "| $g | $med | $(python3 -c "print(f'{$end-$start:.1f}')") |" >> "$tmp/table.md"
done
mv "$tmp/table.md" "$out"
rm -rf "$tmp"
cat "$out"

#!/bin/sh
# bench_throughput's DISK line counts whole steps' reads of the disk tier: after the warm-up (past
# the runtime's re-plan), one measured step and three give the same reads per iteration, give or
# take the prefetches in flight at a window's edge (1-2 reads of ~11 over one step, 4 on a loaded
# machine: 15.0 against 10.7 beside another test's 150 s run; -25% to +50% here; a window that
# missed the first measured step's early reads read 36% fewer over one step);
# a run without the tier prints no DISK line.
# `throughput_disk_line.sh <bench_throughput>`: a small LoRA model on the CPU backend, its cache in
# a temporary folder.
bench="$1"
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
small="--backend cpu --workers 1 --layers 4 --hidden 256 --heads 4 --kv-heads 2 --head-dim 64 --ffn 512
       --vocab 1000 --seq 128 --seqs 2 --micro 2 --warmup 5 --lora-r 8 --base-format nf4"
# the N of "DISK frozen tier read 2.8 MiB per iteration (N reads) ..."
reads() { "$bench" $small --frozen-tier "$dir/c.cache" --steps "$1" 2>&1 | sed -n 's/^DISK frozen tier read .* per iteration (\([0-9.]*\) reads).*/\1/p'; }
one=$(reads 1)
three=$(reads 3)
if [ -z "$one" ] || [ -z "$three" ] || ! awk -v a="$one" -v b="$three" 'BEGIN { exit !(a > 0 && a >= 0.75 * b && a <= 1.5 * b) }'; then
  echo "DISK reads per iteration: $one over 1 step, $three over 3 (expected within -25% and +50%)"; exit 1
fi
if "$bench" $small --steps 1 2>&1 | grep -q '^DISK'; then echo "a DISK line without a tier"; exit 1; fi
echo "DISK reads per iteration: $one over 1 step, $three over 3"

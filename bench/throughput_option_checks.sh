#!/bin/sh
# bench_throughput refuses a bad argument (an option that means something only beside another, a
# value CLI11 rejects, --seqs not a multiple of --micro, a bad --plan) in one line and exit 2,
# before it builds anything: `throughput_option_checks.sh <bench_throughput>`.
bench="$1"
name=bench_throughput
. "$(dirname "$0")/one_line_check.sh"
check "--tier-ring-gib needs --frozen-tier" --tier-ring-gib 1
check "--tier-resident-gib needs --frozen-tier" --tier-resident-gib 1
check "--tier-host-budget-gib needs --frozen-tier" --tier-host-budget-gib 8
check "--tier-spill-layers needs --frozen-tier" --tier-spill-layers 2
check "--frozen-tier needs --lora-r" --frozen-tier /nonexistent/x.cache
check "--tier-spill-layers 100: expected 0..5 (the layers with a saved input: all but the first of 6)" --frozen-tier /nonexistent/x.cache --tier-spill-layers 100 --lora-r 4 --backend cpu --layers 4 --hidden 64 --heads 2 --kv-heads 1 --head-dim 32 --ffn 128 --vocab 128 --seq 16 --seqs 2 --micro 2
check "--frozen-tier needs a non-empty path" --frozen-tier "" --lora-r 4
check "--fp8-stored-direct needs --fp8" --fp8-stored-direct
check "--fp8-wgrad needs --fp8" --fp8-wgrad
check "--bf16-wgrad needs --fp8" --bf16-wgrad
check "--fp8-wgrad and --bf16-wgrad: expected one of them" --fp8 --fp8-wgrad --bf16-wgrad
check "--fp8-wgrad with --lora-r: a frozen base computes no weight gradient" --fp8 --fp8-wgrad --lora-r 4
check "--steps" --steps 0
check "--seqs" --seqs many
check "--dtype" --dtype f64
check "--nope" --nope
check "--seqs 4 --micro 8: expected --micro >= 1 and --seqs a multiple of --micro" --seqs 4 --micro 8
check "--seqs 10 --micro 4: expected" --seqs 10 --micro 4
check "--seqs 8 --micro 0: expected" --micro 0
check "--seq 0: expected" --seq 0
check "--seq 1: expected tokens per sequence >= 2" --seq 1
check "--plan: expected a plan as JSON" --plan '{bad' --backend cpu --layers 2 --hidden 64 --heads 2 --kv-heads 1 --head-dim 32 --ffn 128 --vocab 128 --seq 16 --seqs 2 --micro 2
check "model's shape" --heads 3 --kv-heads 2 --backend cpu
check "--backend: tpu not in" --backend tpu
check "--workers: Value 0 not in range 1 to 1024" --workers 0
check "--experts: Value -1 not in range 0 to 1048576" --experts -1
check "--chunk-bytes: Value -1 not in range 0 to" --chunk-bytes -1
check "--lora-r: Value -1 not in range 0 to 65536" --lora-r -1
check "--expert-ffn: Value -5 not in range 0 to" --experts 4 --expert-ffn -5
check "--mlp-chunk: Value -1 not in range" --mlp-chunk -1
check "--bulk-inflight: Value 0 not in range 1 to 1024" --bulk-inflight 0
check "--cap-gib: expected GiB from 0.001 to 1048576, got 'nan'" --cap-gib nan
check "--cap-gib: expected GiB from 0.001 to 1048576, got '-1'" --cap-gib -1
check "--cap-above-plan: expected a fraction from 0 to 100, got 'nan'" --cap-above-plan nan
check "--lora-alpha needs --lora-r" --lora-alpha 3
check "--lora-alpha: expected a finite value > 0, got -1" --lora-r 4 --lora-alpha -1
check "--lora-alpha: expected a finite value > 0, got 0" --lora-r 4 --lora-alpha 0
check "--lora-alpha: expected a finite value > 0, got nan" --lora-r 4 --lora-alpha nan
check "--base-format needs --lora-r" --base-format nf4
check "--lora-targets needs --lora-r" --lora-targets experts
check "--expert-gemm needs --experts" --expert-gemm bucketed
check "--sparse-step needs --experts" --sparse-step 2
check "--expert-gemm needs a model with experts" --experts 4 --experts-per-tok 2 --sparse-step 8 --expert-gemm bucketed --backend cpu --layers 4 --hidden 64 --heads 2 --kv-heads 1 --head-dim 32 --ffn 128 --vocab 128 --seq 16 --seqs 2 --micro 2 --steps 1
check "--dtype f16 needs --backend cuda" --dtype f16 --backend cpu
check "--results /nonexistent/dir/x.md: expected a file in a folder that exists" --results /nonexistent/dir/x.md
check "--trace /nonexistent/dir/t.json: expected a file in a folder" --trace /nonexistent/dir/t.json
check "--profile-out /nonexistent/p.json: expected a file in a folder" --profile-out /nonexistent/p.json
check "--layers: Value 2000000 not in range 1 to 1024" --layers 2000000
# what is already at an output path: a file only with --force (--results appends to it), never a
# folder, link or pipe, which the write would replace
tmp=$(mktemp -d)
echo keep > "$tmp/keep.txt"
ln -s keep.txt "$tmp/link"
mkdir "$tmp/dir"
mkfifo "$tmp/fifo"
check "--trace $tmp/keep.txt: a file is already there; choose another name or add --force" --trace "$tmp/keep.txt"
check "--profile-out $tmp/keep.txt: a file is already there" --profile-out "$tmp/keep.txt"
check "--trace $tmp/link: something other than a regular file is there" --trace "$tmp/link" --force
check "--profile-out $tmp/fifo: something other than a regular file is there" --profile-out "$tmp/fifo" --force
check "--results $tmp/dir: is a folder; expected a file name" --results "$tmp/dir"
[ "$(cat "$tmp/keep.txt")" = keep ] && [ -L "$tmp/link" ] && [ -p "$tmp/fifo" ] && [ -d "$tmp/dir" ] ||
  { echo "$name: an output check changed what was at the path"; fail=1; }
rm -rf "$tmp"
# weights larger than the memory: one line and exit 1 (an allocation failing on a weight thread
# used to end the program)
out=$(ulimit -v 8000000; "$bench" --backend cpu --layers 2 --hidden 64 --heads 2 --kv-heads 1 --head-dim 32 \
  --ffn 128 --vocab 99999999999 --seq 16 --seqs 2 --micro 2 --steps 1 --warmup 1 2>&1); rc=$?
if [ "$rc" != 1 ] || [ "$(printf '%s\n' "$out" | wc -l)" != 1 ] || ! printf '%s' "$out" | grep -q "do not fit in this machine's memory"; then
  echo "$name --vocab 99999999999: rc $rc, expected one line and exit 1: $out"; fail=1
fi
# the results row names FP8 weight gradients only where they ran: for the linears whose input
# width is a multiple of 16 (none at hidden 24, head_dim 12, ffn 40; 12 of 14 at hidden 32)
tmp=$(mktemp -d)
for h in "24 --head-dim 12" "32 --head-dim 16"; do
  # shellcheck disable=SC2086
  "$bench" --backend cpu --layers 2 --hidden $h --heads 2 --kv-heads 1 --ffn 40 --vocab 128 --seq 16 --seqs 2 \
    --micro 2 --steps 1 --warmup 1 --fp8 --results "$tmp/rows.md" > /dev/null 2>&1 || { echo "$name --hidden $h failed"; fail=1; }
done
grep -q "bf16 + fp8 linears, attention" "$tmp/rows.md" && grep -q "fp8 linears and weight gradients (12 of 14)" "$tmp/rows.md" ||
  { echo "$name: the results rows do not say which weight gradients ran in FP8:"; cat "$tmp/rows.md"; fail=1; }
rm -rf "$tmp"
exit $fail

#!/bin/sh
# bench_throughput refuses a bad argument (an option that means something only beside another, a
# value of the wrong kind or out of range, a flag given twice or without its value, --seqs not a
# multiple of --micro, a bad --plan) in one line naming the flag and exit 2, before it builds
# anything; --help describes every flag: `throughput_option_checks.sh <bench_throughput>`.
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
check "--micro: expected an integer >= 1, got 0" --micro 0
check "--seq: expected an integer >= 2, got 0" --seq 0
check "--seq: expected an integer >= 2, got 1" --seq 1
check "--plan: invalid JSON: syntax error" --plan '{bad' --backend cpu --layers 2 --hidden 64 --heads 2 --kv-heads 1 --head-dim 32 --ffn 128 --vocab 128 --seq 16 --seqs 2 --micro 2
check "model's shape" --heads 3 --kv-heads 2 --backend cpu
check "--backend: tpu not in" --backend tpu
check "--workers: expected an integer from 1 to 1024, got 0" --workers 0
check "--experts: expected an integer from 0 to 1048576 (0: dense), got -1" --experts -1
check "--chunk-bytes: expected an integer from 0 to 1099511627776 (0: whole copies), got -1" --chunk-bytes -1
check "--lora-r: expected an integer from 0 to 65536 (0: full fine-tuning), got -1" --lora-r -1
check "--expert-ffn: expected an integer from 0 to 1073741824 (0: --ffn), got -5" --experts 4 --expert-ffn -5
check "--mlp-chunk: expected an integer from 0 to 1073741824 (0: default), got -1" --mlp-chunk -1
check "--bulk-inflight: expected an integer from 1 to 1024, got 0" --bulk-inflight 0
check "--cap-gib: expected a number of GiB from 0.001 to 1048576, got nan" --cap-gib nan
check "--cap-gib: expected a number of GiB from 0.001 to 1048576, got -1" --cap-gib -1
check "--cap-above-plan: expected a fraction from 0 to 100, got nan" --cap-above-plan nan
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
check "--layers: expected an integer from 1 to 1024, got 2000000" --layers 2000000
# a numeric flag given a value of the wrong kind: one line naming the flag and what it expects
# (CLI11 said "Could not convert: --seq = abc")
check "--workers: expected an integer from 1 to 1024, got two" --workers two
check "--layers: expected an integer from 1 to 1024, got 1.5" --layers 1.5
check "--hidden: expected an integer >= 1, got abc" --hidden abc
check "--heads: expected an integer >= 1, got x" --heads x
check "--kv-heads: expected an integer >= 1, got 0x8" --kv-heads 0x8
check "--head-dim: expected an integer >= 1, got 64k" --head-dim 64k
check "--ffn: expected an integer >= 0 (0 only with every decoder sparse), got wide" --ffn wide
check "--vocab: expected an integer >= 1, got 99999999999999999999" --vocab 99999999999999999999
check "--seq: expected an integer >= 2, got abc" --seq abc
check "--seqs: expected an integer >= 1, got many" --seqs many
check "--micro: expected an integer >= 1, got 2.0" --micro 2.0
check "--steps: expected an integer from 1 to 1000000, got ten" --steps ten
check "--warmup: expected an integer from 1 to 1000000, got 1e1" --warmup 1e1
check "--cap-gib: expected a number of GiB from 0.001 to 1048576, got 24GiB" --cap-gib 24GiB
check "--bulk-inflight: expected an integer from 1 to 1024, got one" --bulk-inflight one
check "--chunk-bytes: expected an integer from 0 to 1099511627776 (0: whole copies), got 32M" --chunk-bytes 32M
check "--mlp-chunk: expected an integer from 0 to 1073741824 (0: default), got 4k" --mlp-chunk 4k
check "--pin-budget-gib: expected a number of GiB from 0 to 1048576, got inf" --pin-budget-gib inf
check "--tier-ring-gib: expected a number of GiB from 0 to 1048576 (0: two buffers), got z" --tier-ring-gib z
check "--tier-resident-gib: expected a number of GiB from 0 to 1048576 (0: all stream), got z" --tier-resident-gib z
check "--tier-host-budget-gib: expected a number of GiB from 0 to 1048576 (0: no budget), got z" --tier-host-budget-gib z
check "--tier-spill-layers: expected an integer from 0 to 1048576 (0: none), got all" --tier-spill-layers all
check "--cap-above-plan: expected a fraction from 0 to 100, got 2%" --cap-above-plan 2%
check "--experts: expected an integer from 0 to 1048576 (0: dense), got 0x10" --experts 0x10
check "--experts-per-tok: expected an integer >= 1, got k" --experts-per-tok k
check "--expert-ffn: expected an integer from 0 to 1073741824 (0: --ffn), got 768.5" --expert-ffn 768.5
check "--sparse-step: expected an integer >= 1, got odd" --sparse-step odd
check "--lora-r: expected an integer from 0 to 65536 (0: full fine-tuning), got r16" --lora-r r16
check "--lora-alpha: expected a finite value > 0, got alpha" --lora-alpha alpha
# ... in the words of its range check: a value of the wrong kind and one out of range say the same
for fv in --workers:0 --layers:0 --hidden:0 --heads:0 --kv-heads:0 --head-dim:0 --ffn:-1 --vocab:0 --seq:1 \
  --seqs:0 --micro:0 --steps:0 --warmup:0 --cap-gib:0 --bulk-inflight:0 --chunk-bytes:-1 --mlp-chunk:-1 \
  --pin-budget-gib:-1 --tier-ring-gib:-1 --tier-resident-gib:-1 --tier-host-budget-gib:-1 --tier-spill-layers:-1 \
  --cap-above-plan:-1 --experts:-1 --experts-per-tok:0 --expert-ffn:-1 --sparse-step:0 --lora-r:-1 --lora-alpha:0; do
  f=${fv%%:*} v=${fv#*:}
  kind=$("$bench" "$f" abc 2>&1) range=$("$bench" "$f" "$v" 2>&1)
  if [ "${kind%, got abc}" != "${range%, got $v}" ] || [ "${kind%, got abc}" = "$kind" ]; then
    echo "$name $f: a wrong kind and a value out of range are worded apart: '$kind' / '$range'"; fail=1
  fi
done
# a flag given twice, or without its value: one line in plain words (CLI11 said "--seq: At Most 1
# required but received 2" and "--seq: 1 required INT missing")
check "bench_throughput: --seq given twice; give it once" --seq 5 --seq 6
check "bench_throughput: --cap-gib given 3 times; give it once" --cap-gib 1 --cap-gib 2 --cap-gib 3
check "bench_throughput: --trace given twice; give it once" --trace a.json --trace b.json
check "bench_throughput: --seq: expected an integer after it, got nothing" --seq
check "bench_throughput: --lora-alpha: expected a number after it, got nothing" --lora-r 4 --lora-alpha
check "bench_throughput: --preset: expected a value after it, got nothing" --preset
# every flag --help lists has a description: from column 31 of its line (CLI11's layout), or on
# the next line, indented, where its name and type are longer
help=$("$bench" --help); rc=$?
undescribed=$(printf '%s\n' "$help" | awk '
  /^  -/ { if (flag != "") print flag; flag = (substr($0, 30, 2) ~ /^ [^ ]/) ? "" : $0; next }
  { if (flag != "" && $0 !~ /^          +[^ -]/) print flag; flag = "" }
  END { if (flag != "") print flag }')
if [ "$rc" != 0 ] || [ -z "$help" ] || [ -n "$undescribed" ]; then
  echo "$name --help: rc $rc, flags without a description:"; printf '%s\n' "$undescribed"; fail=1
fi
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
check "--trace and --profile-out name the same file '$tmp/same.json'" --trace "$tmp/same.json" --profile-out "$tmp/same.json"
check "--trace and --profile-out name the same file '$tmp/./same.json'" --trace "$tmp/./same.json" --profile-out "$tmp/same.json"
check "--plan: invalid JSON: syntax error" --plan '{"forward": '
check "--plan: key 'tail' given twice" --plan '{"tail": [3, 3], "tail": [3, 3]}'
check "--plan: expected a plan object" --plan '[1, 2]'
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

#!/bin/sh
# bench_optimizer_bench refuses a bad argument in one line and exit 2 before it measures anything,
# and keeps an existing --md file unless --force: `optimizer_option_checks.sh <bench_optimizer_bench>`.
bench="$1"
name=bench_optimizer_bench
. "$(dirname "$0")/one_line_check.sh"
check "--threads abc: expected all, or counts from 1" --threads abc
check "--threads 0: expected" --threads 0
check "--threads 1,99999: expected" --threads 1,99999
check "--threads ,: expected" --threads ,
check "--params" --params x
check "--params" --params 0
check "--reps" --reps 0
check "--qwen-layers" --qwen-layers -1
check "not expected: --nope" --nope
check "--md /nonexistent-rp-folder/x.md: no folder" --md /nonexistent-rp-folder/x.md
f=$(mktemp)
echo keep > "$f"
check "the file exists; add --force" --md "$f" --params 1000 --reps 1 --threads 1
[ "$(cat "$f")" = keep ] || { echo "--md replaced an existing file without --force"; fail=1; }
"$bench" --md "$f" --force --params 1000 --reps 1 --threads 1 > /dev/null 2>&1 || { echo "--force run failed"; fail=1; }
grep -q "AdamW" "$f" || { echo "--md --force did not write the report"; fail=1; }
rm -f "$f"
exit $fail

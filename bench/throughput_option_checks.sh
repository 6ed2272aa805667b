#!/bin/sh
# bench_throughput refuses an option that means something only beside another, in one line and
# exit 2, before it builds anything: `throughput_option_checks.sh <bench_throughput>`.
bench="$1"
fail=0
check() {  # expected-line-part args...
  want="$1"; shift
  out=$("$bench" "$@" 2>&1); rc=$?
  lines=$(printf '%s\n' "$out" | wc -l)
  if [ "$rc" != 2 ] || [ "$lines" != 1 ] || ! printf '%s' "$out" | grep -q -- "$want"; then
    echo "bench_throughput $*: rc $rc, $lines lines, expected '$want': $out"; fail=1
  fi
}
check "--tier-ring-gib needs --frozen-tier" --tier-ring-gib 1
check "--tier-resident-gib needs --frozen-tier" --tier-resident-gib 1
check "--tier-host-budget-gib needs --frozen-tier" --tier-host-budget-gib 8
check "--tier-spill-layers needs --frozen-tier" --tier-spill-layers 2
check "--frozen-tier needs --lora-r" --frozen-tier /nonexistent/x.cache
check "--frozen-tier needs a non-empty path" --frozen-tier "" --lora-r 4
check "--fp8-stored-direct needs --fp8" --fp8-stored-direct
check "--fp8-wgrad needs --fp8" --fp8-wgrad
exit $fail

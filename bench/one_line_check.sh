# Sourced by the option-check scripts: `check WANT ARGS...` runs "$bench" ARGS and expects exit 2
# and one line of output containing WANT; a mismatch is printed and sets fail=1. The script sets
# `bench` (the program) and its name `name` first.
fail=0
check() {  # expected-line-part args...
  want="$1"; shift
  out=$("$bench" "$@" 2>&1); rc=$?
  lines=$(printf '%s\n' "$out" | wc -l)
  if [ "$rc" != 2 ] || [ "$lines" != 1 ] || ! printf '%s' "$out" | grep -q -- "$want"; then
    echo "$name $*: rc $rc, $lines lines, expected '$want': $out"; fail=1
  fi
}

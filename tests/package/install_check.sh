#!/usr/bin/env bash
# `cmake --install` as a user runs it: the roundpipe command lands in PREFIX/bin and runs, and
# an outside project finds the package as find_package(RoundPipe) with its imported targets.
#   tests/package/install_check.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
build=$1 src=$2 work=$3
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
bin="$work/prefix/bin/roundpipe"
[ -x "$bin" ] || { echo "not installed: $bin"; exit 1; }
"$bin" --version | head -1 | grep -q '^roundpipe ' || { echo "$bin --version printed no version"; exit 1; }
gen=()
command -v ninja > /dev/null && gen=(-G Ninja)
cmake -S "$src/tests/package/consumer" -B "$work/consumer" "${gen[@]}" -DCMAKE_PREFIX_PATH="$work/prefix" \
      > "$work/consumer.log" 2>&1 || { cat "$work/consumer.log"; exit 1; }
grep -q "roundpipe::cli is $work/prefix/bin/roundpipe" "$work/consumer.log" ||
  { echo "roundpipe::cli does not name the installed command:"; cat "$work/consumer.log"; exit 1; }
echo "installed: $bin; find_package(RoundPipe) gives roundpipe::roundpipe and roundpipe::cli"

#!/usr/bin/env bash
# The installed package, as an outside project sees it: install the build into a scratch
# prefix, compile every public header on its own and build examples/ against the package
# (only the installed headers are on the include path, so a public header that includes an
# internal one fails here).
#   tests/package/build_examples.sh BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
build=$1 src=$2 work=$3
rm -rf "$work"
mkdir -p "$work"

# 1. public headers name only public headers (a quick, readable first check)
bad=$(grep -n '#include "' "$src"/include/roundpipe/*.hpp | grep -v '#include "roundpipe/' || true)
if [ -n "$bad" ]; then
  echo "public headers include internal ones:"
  echo "$bad"
  exit 1
fi

# 2. install
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
leaked=$(find "$work/prefix/include" -type f ! -path "*/include/roundpipe/*" | head -5)
if [ -n "$leaked" ]; then
  echo "installed headers outside include/roundpipe/: $leaked"
  exit 1
fi

# 3. outside projects against the package: every header alone, then the examples
gen=()
command -v ninja > /dev/null && gen=(-G Ninja)
launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
for p in headers:"$src/tests/package/headers" examples:"$src/examples"; do
  name=${p%%:*} dir=${p#*:}
  echo "[package] configuring and building $name against $work/prefix"
  cmake -S "$dir" -B "$work/$name" "${gen[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_PREFIX_PATH="$work/prefix" > "$work/$name.configure.log" ||
    { cat "$work/$name.configure.log"; exit 1; }
  cmake --build "$work/$name" -j2
done

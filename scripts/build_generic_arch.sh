#!/usr/bin/env bash
# Builds the CUDA test programs as PTX of one generic architecture and bundles them for a GPU
# machine (docs/gpu.md, "Testing the pre-Hopper paths"). Run it whenever kernels change:
#   scripts/build_generic_arch.sh 80-virtual build-arch80 [.device-arch80]
#   scripts/build_generic_arch.sh 89-virtual build-arch89 [.device-arch89]
# With ARCH = 80-virtual the binaries hold only compute_80 PTX: on an H100/H200 the driver
# JIT-compiles it, so every `__CUDA_ARCH__ >= 900` branch is compiled out and the tests run
# the code an A100, RTX 3090 or RTX 4090 runs. bench/device_generic_arch.sh runs them there.
# BUNDLE_SH: the script that copies programs and their non-CUDA shared libraries into the
# bundle (default ../shared/device/bundle.sh or ../../shared/device/bundle.sh, this workplace's; elsewhere any script with its
# usage "bundle.sh OUTDIR PROGRAM..."). JOBS (default 2) parallel compile jobs. TARGETS (default
# "test_kernels test_model test_actors"): the test (or benchmark) programs to build and bundle.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,12p "$0"; exit 2; }
arch=$1 build=$2 bundle=${3:-.device-arch${1%%-*}}
case "$arch" in
  [0-9]*-virtual) ;;
  *) echo "build_generic_arch.sh: ARCH must be PTX only, like 80-virtual or 89-virtual (got '$arch')" >&2; exit 2 ;;
esac
case "$bundle" in
  .device*) ;;
  *) echo "build_generic_arch.sh: the bundle folder must be .device* (ignored by git; got '$bundle')" >&2; exit 2 ;;
esac
# only a folder this script made (it holds ARCH) is replaced
for d in "$bundle" "$bundle.part"; do
  if [ -e "$d" ] && [ ! -f "$d/ARCH" ]; then
    echo "build_generic_arch.sh: $d exists and was not made by this script; remove it or name another folder" >&2; exit 2
  fi
done
bundle_sh=${BUNDLE_SH:-}
if [ -z "$bundle_sh" ]; then
  for c in ../shared/device/bundle.sh ../../shared/device/bundle.sh; do [ -x "$c" ] && bundle_sh=$c && break; done
fi
[ -n "$bundle_sh" ] && [ -x "$bundle_sh" ] || { echo "build_generic_arch.sh: no bundling script (../shared/device/bundle.sh; set BUNDLE_SH)" >&2; exit 2; }
launch=()
if command -v ccache >/dev/null 2>&1; then
  launch=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
# RP_NATIVE=OFF: the binaries run on another machine's CPU
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRP_NATIVE=OFF \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" "${launch[@]}" | grep "RoundPipe:" || true
read -r -a targets <<< "${TARGETS:-test_kernels test_model test_actors}"
nice cmake --build "$build" -j"${JOBS:-2}" --target "${targets[@]}"
tmp=$bundle.part
rm -rf "$tmp"
mkdir -p "$tmp"
echo "$arch" > "$tmp/ARCH"
programs=()
for t in "${targets[@]}"; do  # test programs live in tests/, benchmarks in bench/
  for d in tests bench examples; do [ -x "$build/$d/$t" ] && programs+=("$build/$d/$t") && break; done
done
"$bundle_sh" "$tmp" "${programs[@]}" >/dev/null
strip --strip-unneeded "$tmp"/bin/*  # symbols are most of the size; a carried call holds 64 MiB
rm -rf "$bundle"
mv "$tmp" "$bundle"
du -sh "$bundle"
echo "run on the GPU machine (carry $bundle): BUNDLE=$bundle RP_BUILD_SRC=$PWD bash bench/device_generic_arch.sh"

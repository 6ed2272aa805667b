#!/usr/bin/env bash
# Checks that every C++/CUDA source the project tracks is formatted as .clang-format says, with
# clang-format 14 (other major versions format some constructs differently, so the check pins
# one; scripts/setup.sh installs it). Prints each offending file and line; exit 1 if any.
#   scripts/check_format.sh          # check
#   scripts/check_format.sh --fix    # reformat in place (only the files listed by git)
# Exit 77 (CTest: skipped) with the reason when clang-format 14 or git is missing.
set -euo pipefail
case "$#:${1:-}" in
  0: | 1:--fix) ;;
  *) echo "check_format: unknown arguments '$*' (expected none, or --fix)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
cf=""
for c in clang-format-14 clang-format; do
  if command -v "$c" >/dev/null 2>&1 && "$c" --version | grep -q 'version 14\.'; then cf="$c"; break; fi
done
if [ -z "$cf" ]; then echo "check_format: skipped: clang-format 14 not found (scripts/setup.sh installs clang-format-14)"; exit 77; fi
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then echo "check_format: skipped: not a git checkout (the files checked are the ones git tracks)"; exit 77; fi
mapfile -t files < <(git ls-files -- '*.cpp' '*.hpp' '*.cu' '*.cuh' '*.h' | grep -v '^third_party/')
if [ "${1:-}" = --fix ]; then "$cf" -i "${files[@]}"; exit 0; fi
if ! out=$("$cf" --dry-run -Werror "${files[@]}" 2>&1); then
  echo "$out" | grep -E '^[^ ].*: (error|warning):' | head -40
  n=$(echo "$out" | grep -cE ': (error|warning):' || true)
  echo "check_format: $n place(s) differ from .clang-format; run scripts/check_format.sh --fix (or git clang-format-14 on your change)"
  exit 1
fi
echo "check_format: ${#files[@]} files formatted as .clang-format says"

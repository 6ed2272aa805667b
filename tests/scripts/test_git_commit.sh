#!/bin/sh
# cmake/git_commit.cmake, which writes the commit `roundpipe --version` names at every build:
# a checkout's HEAD ("<HEAD>-dirty" with uncommitted edits of tracked files), "unknown" outside one (also in a folder that a repository merely holds, as a
# release tarball unpacked inside one), and the header left untouched while the commit stays.
#   test_git_commit.sh <cmake> <cmake/git_commit.cmake>
set -eu
cmake=$1
script=$2
if ! command -v git >/dev/null 2>&1; then
  echo "script_git_commit: skipped: git is not installed"
  exit 77
fi
unset GIT_DIR GIT_WORK_TREE
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
h=$t/out/roundpipe_commit.hpp
fail() {
  echo "script_git_commit: $*" >&2
  exit 1
}
run() { "$cmake" -DSOURCE_DIR="$1" -DOUTPUT="$h" -P "$script"; }
commit_of() { sed -n 's/.*kGitCommit = "\([^"]*\)".*/\1/p' "$h"; }
git_in() { git -C "$t/repo" -c user.name=test -c user.email=test@example.com "$@"; }

mkdir -p "$t/out" "$t/tarball"
run "$t/tarball"
[ "$(commit_of)" = unknown ] || fail "outside a checkout: '$(commit_of)', expected unknown"

git init -q "$t/repo"
git_in commit -q --allow-empty -m one
run "$t/repo"
[ "$(commit_of)" = "$(git_in rev-parse --short=12 HEAD)" ] || fail "a checkout: '$(commit_of)', expected its HEAD"

touch -d 2000-01-01 "$h"  # the same commit again: the file (and what includes it) stays as it was
run "$t/repo"
[ "$(stat -c %Y "$h")" = "$(date -d 2000-01-01 +%s)" ] || fail "rewritten although the commit did not change"

git_in commit -q --allow-empty -m two
run "$t/repo"
[ "$(commit_of)" = "$(git_in rev-parse --short=12 HEAD)" ] || fail "a new commit: '$(commit_of)', expected the new HEAD"

echo a > "$t/repo/f" && git_in add f && git_in commit -q -m three
echo b > "$t/repo/f"  # a tracked file edited, not committed
run "$t/repo"
[ "$(commit_of)" = "$(git_in rev-parse --short=12 HEAD)-dirty" ] || fail "uncommitted edits: '$(commit_of)', expected HEAD-dirty"
git_in checkout -q f
echo c > "$t/repo/untracked"  # an untracked file is not the build's: no -dirty
run "$t/repo"
[ "$(commit_of)" = "$(git_in rev-parse --short=12 HEAD)" ] || fail "an untracked file: '$(commit_of)', expected HEAD"

mkdir "$t/repo/unpacked"
run "$t/repo/unpacked"
[ "$(commit_of)" = unknown ] || fail "a folder inside another repository: '$(commit_of)', expected unknown"
echo "script_git_commit: ok"

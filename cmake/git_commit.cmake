# Writes the header that names the commit a build is made from (roundpipe_commit.hpp, included
# by roundpipe_version.hpp): run with `cmake -P` at every build (the target rp_git_commit) and
# once at configure time. The file is rewritten only when the commit changed, so a build of an
# unchanged checkout recompiles nothing. "<commit>-dirty" when tracked files have uncommitted
# edits; "unknown" when SOURCE_DIR is not the top of a git
# checkout (a release tarball, also one unpacked inside another repository) or git is missing.
#
#   cmake -DSOURCE_DIR=<source tree> -DOUTPUT=<header> [-DGIT_EXECUTABLE=<git>] -P git_commit.cmake
cmake_minimum_required(VERSION 3.25)
if(NOT DEFINED SOURCE_DIR OR NOT DEFINED OUTPUT)
  message(FATAL_ERROR "git_commit.cmake: pass -DSOURCE_DIR=<source tree> -DOUTPUT=<header>")
endif()
if(NOT GIT_EXECUTABLE)
  find_program(GIT_EXECUTABLE git)
endif()

set(commit unknown)
if(GIT_EXECUTABLE)
  execute_process(COMMAND "${GIT_EXECUTABLE}" rev-parse --show-toplevel --short=12 HEAD
                  WORKING_DIRECTORY "${SOURCE_DIR}" OUTPUT_VARIABLE out RESULT_VARIABLE rc ERROR_QUIET
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(rc EQUAL 0)
    string(REPLACE "\n" ";" lines "${out}")
    list(LENGTH lines n)
    if(n EQUAL 2)
      list(GET lines 0 top)
      list(GET lines 1 head)
      file(REAL_PATH "${top}" top)
      file(REAL_PATH "${SOURCE_DIR}" src)
      # the source tree's own checkout, not a repository that merely holds it
      if(top STREQUAL src AND head MATCHES "^[0-9a-f]+$")
        set(commit "${head}")
        # edits of tracked files not committed: the binary is not that commit's ("<head>-dirty",
        # as git describe --dirty says), so a benchmark's or a bug report's commit does not lie
        execute_process(COMMAND "${GIT_EXECUTABLE}" status --porcelain --untracked-files=no
                        WORKING_DIRECTORY "${SOURCE_DIR}" OUTPUT_VARIABLE changes RESULT_VARIABLE rc
                        ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
        if(rc EQUAL 0 AND NOT changes STREQUAL "")
          set(commit "${head}-dirty")
        endif()
      endif()
    endif()
  endif()
endif()

set(text "// Generated at build time by cmake/git_commit.cmake: the commit `roundpipe --version` names.
#pragma once

namespace rp {
inline constexpr const char* kGitCommit = \"${commit}\";  ///< \"unknown\" outside a git checkout, \"<commit>-dirty\" with uncommitted edits
}  // namespace rp
")
set(old "")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUTPUT}" "${text}")
endif()

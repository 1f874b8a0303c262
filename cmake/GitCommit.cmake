# Writes OUTPUT (a C++ header) with the git commit of SOURCE_DIR, "-dirty" appended when tracked
# files differ from it; the file is rewritten only when that text changes, so a build after a
# commit recompiles the few files that record it and nothing else. Run at every build
# (CMakeLists.txt: target mgbench_git_commit), so results files never carry a stale commit.
#   cmake -DSOURCE_DIR=<checkout> -DOUTPUT=<header> -P cmake/GitCommit.cmake
execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --short=12 HEAD OUTPUT_VARIABLE commit
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR commit STREQUAL "")
  set(commit "unknown")
else()
  execute_process(COMMAND git -C "${SOURCE_DIR}" status --porcelain --untracked-files=no OUTPUT_VARIABLE changes
                  ERROR_QUIET RESULT_VARIABLE rc)
  if(rc EQUAL 0 AND NOT changes STREQUAL "")
    string(APPEND commit "-dirty")
  endif()
endif()
set(text "#pragma once\n// Generated at build time by cmake/GitCommit.cmake.\nnamespace mgbench::build_info {\ninline constexpr const char* kGitCommit = \"${commit}\";\n}  // namespace mgbench::build_info\n")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
else()
  set(old "")
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUTPUT}" "${text}")
endif()

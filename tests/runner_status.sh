#!/bin/sh
# The test runner_exit_status: the exit status of the gtest main (tests/unit/test_main.cpp) and of
# the pytest conftest, on which every SKIP_RETURN_CODE 77 in tests/CMakeLists.txt relies.
# Usage: runner_status.sh GTEST_CASES_BINARY PYTHON PYTEST_CASES_FILE MPIEXEC
status() { "$@" >/dev/null 2>&1; echo $?; }
gtest=$(status "$1")
gtest_fail=$(MGBENCH_RUNNER_STATUS_FAIL=1 status "$1")
# Two ranks, rank 0 failing before a barrier: status 1 within the minute (124: the job hung).
collective=$(MGBENCH_RUNNER_STATUS_COLLECTIVE=1 status timeout 60 "$4" -n 2 --oversubscribe "$1")
pytest=$(status "$2" -m pytest -q -p no:cacheprovider "$3")
pytest_fail=$(MGBENCH_RUNNER_STATUS_FAIL=1 status "$2" -m pytest -q -p no:cacheprovider "$3")
# In CI (MGBENCH_CI=1): a skip for a missing input is a failure; the machine's own skips stay skips.
missing=$(MGBENCH_CI=0 MGBENCH_RUNNER_STATUS_MISSING=1 status "$2" -m pytest -q -p no:cacheprovider "$3")
ci_missing=$(MGBENCH_CI=1 MGBENCH_RUNNER_STATUS_MISSING=1 status "$2" -m pytest -q -p no:cacheprovider "$3")
ci_not_here=$(MGBENCH_CI=1 status "$2" -m pytest -q -p no:cacheprovider "$3")
gtest_missing=$(MGBENCH_CI=0 MGBENCH_RUNNER_STATUS_MISSING=1 status "$1")
gtest_ci_missing=$(MGBENCH_CI=1 MGBENCH_RUNNER_STATUS_MISSING=1 status "$1")
echo "all skipped: gtest $gtest, pytest $pytest (expected 77); one failed beside a skipped one: gtest $gtest_fail, pytest $pytest_fail (expected 1); one rank failed before a collective: gtest $collective (expected 1); a missing input: pytest $missing, gtest $gtest_missing, in CI pytest $ci_missing, gtest $gtest_ci_missing (expected 77, 77, 1, 1); the machine's skips in CI: $ci_not_here (expected 77)"
[ "$collective" = 1 ] && [ "$gtest" = 77 ] && [ "$pytest" = 77 ] && [ "$gtest_fail" = 1 ] && [ "$pytest_fail" = 1 ] &&
  [ "$missing" = 77 ] && [ "$ci_missing" = 1 ] && [ "$ci_not_here" = 77 ] && [ "$gtest_missing" = 77 ] &&
  [ "$gtest_ci_missing" = 1 ]

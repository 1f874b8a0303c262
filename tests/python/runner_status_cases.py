"""Cases for the test `runner_exit_status` (tests/CMakeLists.txt), which checks conftest.py's exit
status: 77 where every test skipped, 1 where one failed beside a skipped one (never "skipped"); in CI
(MGBENCH_CI=1) a skip for a missing input fails (1), a not_here skip stays one (77).
Not named test_*: a plain `pytest tests/python` does not collect it."""
import os

import pytest

from conftest import not_here


def test_skips():
    not_here("skipped on purpose")


def test_fails_when_asked():
    if "MGBENCH_RUNNER_STATUS_FAIL" not in os.environ:
        not_here("MGBENCH_RUNNER_STATUS_FAIL not set")
    pytest.fail("failed on purpose")


def test_misses_an_input_when_asked():
    if "MGBENCH_RUNNER_STATUS_MISSING" not in os.environ:
        not_here("MGBENCH_RUNNER_STATUS_MISSING not set")
    pytest.skip("no input at /nowhere")

"""Cases for the test `runner_exit_status` (tests/CMakeLists.txt), which checks conftest.py's exit
status: 77 where every test skipped, 1 where one failed beside a skipped one (never "skipped").
Not named test_*: a plain `pytest tests/python` does not collect it."""
import os

import pytest


def test_skips():
    pytest.skip("skipped on purpose")


def test_fails_when_asked():
    if "MGBENCH_RUNNER_STATUS_FAIL" not in os.environ:
        pytest.skip("MGBENCH_RUNNER_STATUS_FAIL not set")
    pytest.fail("failed on purpose")

"""The tests do not depend on how pytest was started: the signal tests pass when pytest
starts as `setsid nohup make test </dev/null &` does, with SIGINT ignored, no terminal and a
session of its own (as some CI runners and daemons start jobs)."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Tests that send SIGINT or SIGTERM to themselves or to processes they start, and count the
# processes left.
SIGNAL_TESTS = [
    "tests/test_pool.py::test_interrupted_caller_leaves_no_process_or_zombie",
    "tests/test_pool.py::test_caller_process_stopped_by_a_signal_leaves_no_sandbox_behind",
    "tests/test_errors.py::test_bad_input_is_one_line[Ctrl-C]",
    "tests/test_errors.py::test_bad_input_is_one_line[SIGTERM]",
]


def _as_nohup_in_background() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.timeout(600)
def test_signal_tests_pass_when_started_with_sigint_ignored():
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SIGNAL_TESTS],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        start_new_session=True,
        preexec_fn=_as_nohup_in_background,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "7 passed" in result.stdout, result.stdout[-2000:]

"""tests/run_suite.py: `make test` runs the learning tests beside the rest of the suite."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from run_suite import LEARNING, REPO, run_beside

PYTHON = sys.executable
AUTOGROUP = Path("/proc/self/autogroup")


def python(code: str) -> list[str]:
    return [PYTHON, "-c", code]


def test_the_background_output_comes_after_the_foregrounds_and_its_failure_counts(capfd):
    background = python("import os; print('background at', os.nice(0)); raise SystemExit(3)")
    status = run_beside(background, [python("print('first')"), python("print('second')")], 7)
    out = capfd.readouterr().out
    assert status == 3
    assert out.index("first") < out.index("second") < out.index("background at")
    assert f"background at {os.nice(0) + 7}" in out


@pytest.mark.skipif(not AUTOGROUP.exists(), reason="this kernel has no autogroups")
def test_the_background_has_a_session_and_an_autogroup_of_its_own_at_its_niceness(capfd):
    report = "import os; print('background', os.getsid(0), open('/proc/self/autogroup').read())"
    assert run_beside(python(report), [], 5) == 0
    line = capfd.readouterr().out.split("background ")[-1]
    session, autogroup = line.split()[:2]
    assert int(session) != os.getsid(0)
    assert autogroup != AUTOGROUP.read_text().split()[0]
    assert line.split()[2:4] == ["nice", "5"]


def test_a_failed_foreground_command_stops_the_rest_and_the_background(capfd):
    started = time.monotonic()
    background = python("import time; print('started', flush=True); time.sleep(600)")
    failing = python("import time; time.sleep(1); raise SystemExit(2)")
    assert run_beside(background, [failing, python("print('never run')")], 10) == 2
    assert time.monotonic() - started < 60
    out = capfd.readouterr().out
    assert "started" in out and "KeyboardInterrupt" in out and "never run" not in out


def test_a_background_killed_by_a_signal_is_a_failure():
    assert run_beside(python("import os; os.kill(os.getpid(), 9)"), [python("")], 0) == 128 + 9


def test_make_test_runs_the_suite_through_it_and_the_learning_module_exists():
    makefile = (REPO / "Makefile").read_text()
    assert "test: setup\n\t$(BIN)/python tests/run_suite.py\n" in makefile
    assert (REPO / LEARNING).is_file()

"""tests/run_suite.py: `make test` runs the learning tests beside the rest of the suite."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from run_suite import (
    GRPO,
    LEARNING,
    REPO,
    SEEDS,
    VERIFICATION,
    machine_cpu_seconds,
    machine_use,
    main,
    run_beside,
)

PYTHON = sys.executable
AUTOGROUP = Path("/proc/self/autogroup")
# run_suite kills a background that an interrupt has not stopped within 60 s
STOPPED_BEFORE_THE_KILL = 50


def python(code: str) -> list[str]:
    return [PYTHON, "-c", code]


OK = python("")


def test_the_background_output_comes_after_the_foregrounds_and_its_failure_counts(capfd):
    background = python("import os; print('background at', os.nice(0)); raise SystemExit(3)")
    status = run_beside(background, python("print('first')"), python("print('second')"), 7)
    out = capfd.readouterr().out
    assert status == 3
    assert out.index("first") < out.index("second") < out.index("background at")
    assert f"background at {os.nice(0) + 7}" in out


def autogroups_in_effect() -> bool:
    """The kernel has autogroups and schedules this process by one: /proc/self/autogroup is
    empty where its cpu cgroup is not the root one (a container's), and nice counts there."""
    return AUTOGROUP.exists() and AUTOGROUP.read_text().strip() != ""


def test_the_background_runs_in_a_session_of_its_own(capfd):
    assert run_beside(python("import os; print('background', os.getsid(0))"), OK, OK, 5) == 0
    session = capfd.readouterr().out.split("background ")[-1].split()[0]
    assert int(session) != os.getsid(0)


@pytest.mark.skipif(not autogroups_in_effect(), reason="no autogroup schedules this process")
def test_the_backgrounds_session_has_an_autogroup_of_its_own_at_its_niceness(capfd):
    report = "print('background', open('/proc/self/autogroup').read())"
    assert run_beside(python(report), OK, OK, 5) == 0
    autogroup = capfd.readouterr().out.split("background ")[-1].split()
    assert autogroup[0] != AUTOGROUP.read_text().split()[0]
    assert autogroup[1:3] == ["nice", "5"]


def started_and_failing(marker: Path, status: int) -> tuple[list[str], list[str]]:
    """A background that marks it has started (so an interrupt is a KeyboardInterrupt, not a
    kill during start-up) and sleeps, and a command that fails once it has."""
    mark = f"pathlib.Path({str(marker)!r})"
    background = python(f"import pathlib, time; {mark}.touch(); time.sleep(600)")
    wait = f"import pathlib, time\nwhile not {mark}.exists(): time.sleep(0.05)"
    return background, python(f"{wait}\nraise SystemExit({status})")


def test_a_failed_before_stops_the_background_and_skips_the_foreground(capfd, tmp_path):
    started = time.monotonic()
    background, failing = started_and_failing(tmp_path / "started", 2)
    assert run_beside(background, failing, python("print('never run')"), 10) == 2
    assert time.monotonic() - started < STOPPED_BEFORE_THE_KILL
    out = capfd.readouterr().out
    assert "KeyboardInterrupt" in out and "never run" not in out


def test_a_failed_foreground_leaves_the_background_to_finish(capfd):
    background = python("import time; time.sleep(2); print('background finished')")
    assert run_beside(background, OK, python("raise SystemExit(5)"), 10) == 5
    out = capfd.readouterr().out
    assert "background finished" in out and "KeyboardInterrupt" not in out


def test_the_background_is_interrupted_even_where_sigint_was_ignored(capfd, tmp_path):
    """As in a shell's background job: the interrupt must still reach the learning tests."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        started = time.monotonic()
        background, failing = started_and_failing(tmp_path / "started", 4)
        assert run_beside(background, failing, OK, 10) == 4
        assert time.monotonic() - started < STOPPED_BEFORE_THE_KILL
    finally:
        signal.signal(signal.SIGINT, previous)
    assert "KeyboardInterrupt" in capfd.readouterr().out


def test_a_background_killed_by_a_signal_is_a_failure():
    assert run_beside(python("import os; os.kill(os.getpid(), 9)"), OK, OK, 0) == 128 + 9


def test_make_test_runs_the_suite_through_it_and_the_learning_module_exists():
    makefile = (REPO / "Makefile").read_text()
    assert "test: setup\n\t$(BIN)/python tests/run_suite.py\n" in makefile
    assert (REPO / LEARNING).is_file()


def test_the_verification_nulls_and_the_second_seed_run_in_their_own_targets_not_in_the_rest(
    monkeypatch,
):
    makefile = (REPO / "Makefile").read_text()
    assert f"test-verification: setup\n\t$(BIN)/python -m pytest -ra {VERIFICATION}\n" in makefile
    assert f"test-seeds: setup\n\t$(BIN)/python -m pytest -ra {SEEDS}\n" in makefile
    assert f"test-grpo: setup\n\t$(BIN)/python -m pytest -ra {GRPO}\n" in makefile
    commands = []
    monkeypatch.setattr("run_suite.signal.signal", lambda *_: None)  # main's SIGTERM handler
    monkeypatch.setattr("run_suite.run_beside", lambda *args: commands.append(args) or 0)
    assert main() == 0
    [(learning, _, rest, _)] = commands
    assert learning[-1] == LEARNING
    assert not {VERIFICATION, SEEDS, GRPO} & set(learning)
    for module in (LEARNING, VERIFICATION, SEEDS, GRPO):
        assert f"--ignore={module}" in rest


def test_the_machines_cpu_counts_every_busy_field_and_leaves_idle_and_iowait_out():
    tick = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat = f"cpu  {tick * 10} {tick * 5} {tick * 2} {tick * 30} {tick} 0 {tick} 0 {tick * 9} 0\n"
    assert machine_cpu_seconds(stat + "cpu0 1 2 3 4\n") == (18.0, 31.0)


def test_the_suite_ends_saying_how_busy_the_whole_machine_was(monkeypatch, capfd):
    readings = iter([(100.0, 50.0), (280.0, 70.0)])
    monkeypatch.setattr("run_suite.machine_cpu_seconds", lambda: next(readings))
    monkeypatch.setattr("run_suite.signal.signal", lambda *_: None)  # main's SIGTERM handler
    monkeypatch.setattr("run_suite.run_beside", lambda *args: 0)
    monkeypatch.setattr("run_suite.time.monotonic", iter([0.0, 100.0]).__next__)
    assert main() == 0
    cores = os.cpu_count()
    line = capfd.readouterr().out.strip().splitlines()[-1]
    assert line == (
        "the machine during the suite: 180 CPU-s busy, 20 idle, in 100 s "
        f"(1.80 of {cores} cores busy)"
    )
    assert machine_use((0.0, 0.0), (1.0, 1.0), 2.0).endswith(f"(0.50 of {cores} cores busy)")

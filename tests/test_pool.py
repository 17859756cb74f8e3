"""The worker pool: order, bounds, per-program results, cancellation, deadlines, interrupts."""

from __future__ import annotations

import _thread
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from isolation import default_signals, keyboard_interrupt_on_sigint, sandbox_processes
from test_sandbox_battery import children_of

from reasonrl.sandbox import CancelToken, Sandbox, SandboxLimits, SandboxResult
from reasonrl.sandbox import bwrap as bwrap_module
from reasonrl.sandbox.cgroups import memory_parent, owner_is_gone
from reasonrl.sandbox.pool import Program, SandboxRefused, WorkerPool

pytestmark = pytest.mark.timeout(120)

LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=20, memory_mb=256, max_output_chars=64)
# Each program prints when it ran (the host and the sandbox share the wall clock).
TIMED = "import time\nstart = time.time()\ntime.sleep({seconds})\nprint(start, time.time())\n"


def max_overlap(results) -> int:
    """The most programs that ran at the same moment, from their printed start/end times."""
    events = []
    for result in results:
        start, end = map(float, result.stdout.split())
        events += [(start, 1), (end, -1)]
    running = most = 0
    for _, change in sorted(events, key=lambda e: (e[0], e[1])):
        running += change
        most = max(most, running)
    return most


def describe(pid: int) -> str:
    """pid, state, parent and command of a process, for a failure message."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return f"{pid} (gone)"
    state, parent = stat.rsplit(")", 1)[1].split()[:2]
    return f"{pid} state {state} parent {parent}: {command.decode(errors='replace')[:80]}"


@pytest.fixture
def assert_nothing_left():
    """Checks that no sandbox of this process (or of the callers named) and no new child of
    this process is left.

    Other modules' session fixtures (dockerd, the SLURM daemons) may stay children of this
    process for the whole session; only the children a test adds count against it.
    """
    before = children_of(os.getpid())

    def new_children() -> set[int]:
        return children_of(os.getpid()) - before

    def check(callers: tuple[int, ...] = ()) -> None:
        """callers: processes the test started whose sandboxes count too."""
        # A killed caller's sandboxes die after it and its orphans go to the host's init to be
        # reaped: on a loaded machine either can take seconds (once in CI, one was left at 3 s).
        deadline = time.monotonic() + 10
        while (sandbox_processes(callers) or new_children()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [describe(pid) for pid in sandbox_processes(callers)] == []
        assert new_children() == set()  # zombies are children too, until reaped

    return check


def test_results_in_order_with_status_duration_and_capped_output():
    programs = [
        "import time\ntime.sleep(0.6)\nprint('first')",
        "print('x' * 1000)",
        "1/0",
        Program("print(input())", stdin="from stdin"),
        Program("import time\ntime.sleep(5)", limits=SandboxLimits(wall_seconds=0.5)),
    ]
    results = WorkerPool(Sandbox(LIMITS), workers=3).run(programs)
    assert [r.status for r in results] == ["ok", "output-limit", "error", "ok", "timeout"]
    assert results[0].stdout == "first\n" and results[0].duration >= 0.6
    assert len(results[1].stdout) == LIMITS.max_output_chars
    assert results[2].stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert results[3].stdout == "from stdin\n"
    assert 0.5 <= results[4].duration < 2
    assert WorkerPool(Sandbox(LIMITS)).run([]) == []


def test_workers_bound_how_many_run_at_once():
    programs = [TIMED.format(seconds=0.8)] * 6
    results = WorkerPool(Sandbox(LIMITS), workers=2).run(programs)
    assert max_overlap(results) == 2
    assert WorkerPool(Sandbox(LIMITS), workers=3).concurrency == 3


def test_memory_budget_bounds_how_many_run_at_once():
    sandbox = Sandbox(LIMITS, workers=4, pool_memory_mb=2 * LIMITS.memory_mb)
    pool = WorkerPool(sandbox)
    assert pool.concurrency == 2
    assert max_overlap(pool.run([TIMED.format(seconds=0.8)] * 5)) == 2
    assert WorkerPool(sandbox, memory_mb=LIMITS.memory_mb // 2).concurrency == 1


def test_cancel_stops_running_and_pending_programs(assert_nothing_left):
    pool = WorkerPool(Sandbox(LIMITS), workers=2)
    threading.Timer(1.0, pool.cancel).start()
    started = time.monotonic()
    results = pool.run(["import time\ntime.sleep(30)"] * 6)
    assert [r.status for r in results] == ["cancelled"] * 6
    assert time.monotonic() - started < 5
    assert results[0].output.startswith("[cancelled: the batch was cancelled")
    assert_nothing_left()
    assert pool.run(["print(1)"])[0].status == "ok"  # the next batch is not cancelled


def test_a_callers_token_cancels_a_batch_even_before_it_starts(assert_nothing_left):
    pool = WorkerPool(Sandbox(LIMITS), workers=2)
    token = CancelToken()
    try:
        token.cancel()  # as a caller on another thread may, before the batch is under way
        started = time.monotonic()
        results = pool.run(["import time\ntime.sleep(30)"] * 3, cancel=token)
        assert [r.status for r in results] == ["cancelled"] * 3
        assert time.monotonic() - started < 2
        assert_nothing_left()
    finally:
        token.close()  # the caller's, not the pool's: still open after the batch
    assert pool.run(["print(1)"])[0].status == "ok"


def test_batch_deadline_cancels_what_has_not_finished(assert_nothing_left):
    programs = ["print('quick')", "print('quick')"] + ["import time\ntime.sleep(30)"] * 4
    started = time.monotonic()
    results = WorkerPool(Sandbox(LIMITS), workers=2).run(programs, deadline_seconds=1.5)
    assert [r.status for r in results] == ["ok", "ok"] + ["cancelled"] * 4
    assert time.monotonic() - started < 4
    assert_nothing_left()


@pytest.mark.parametrize("interrupt", ["ctrl-c", "flagged"])
def test_interrupted_caller_leaves_no_process_or_zombie(interrupt, assert_nothing_left):
    send = {
        "ctrl-c": lambda: os.kill(os.getpid(), signal.SIGINT),
        "flagged": _thread.interrupt_main,
    }[interrupt]
    threading.Timer(1.0, send).start()
    started = time.monotonic()
    with keyboard_interrupt_on_sigint(), pytest.raises(KeyboardInterrupt):
        WorkerPool(Sandbox(LIMITS), workers=2).run(["import time\ntime.sleep(30)"] * 4)
    assert time.monotonic() - started < 5
    assert_nothing_left()


CALLER = """
import sys
from reasonrl.sandbox.pool import WorkerPool
from reasonrl.sandbox import CancelToken, Sandbox, SandboxLimits
pool = WorkerPool(Sandbox(SandboxLimits(wall_seconds=60)), workers=3)
print("started", flush=True)
pool.run(["import os, time\\nif os.fork() == 0:\\n    os.setsid()\\ntime.sleep(60)"] * 6)
"""


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_caller_process_stopped_by_a_signal_leaves_no_sandbox_behind(
    how, tmp_path: Path, assert_nothing_left
):
    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=default_signals,
    )
    assert caller.stdout.readline() == b"started\n"
    deadline = time.monotonic() + 10
    while len(sandbox_processes([caller.pid])) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)  # three sandboxes, each a program and its setsid child
    assert len(sandbox_processes([caller.pid])) >= 6
    caller.send_signal(how)
    caller.wait(timeout=10)
    caller.stdout.close()
    caller.stderr.close()
    assert_nothing_left((caller.pid,))
    # A caller killed outright leaves its host folders and cgroups; the next run removes them.
    assert Sandbox(LIMITS).run("pass").status == "ok"
    left = [p.name for p in Path(tempfile.gettempdir()).glob(f"reasonrl-sandbox-{caller.pid}-*")]
    parent = memory_parent()
    if parent is not None:
        left += [p.name for p in parent[0].glob(f"reasonrl-sandbox-{caller.pid}-*")]
    assert left == []


def test_only_folders_of_gone_pids_count_as_stale():
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    assert owner_is_gone(f"reasonrl-sandbox-{int(gone.stdout)}-abc")
    assert not owner_is_gone(f"reasonrl-sandbox-{os.getpid()}-abc")
    assert not owner_is_gone("reasonrl-sandbox-12345678")  # the old naming, no pid
    assert not owner_is_gone("reasonrl-sandbox-uids")


def test_a_batch_of_more_programs_than_workers_runs_every_one():
    """Through the warm zygotes (a batch larger than its workers), for every runner's uid."""
    results = WorkerPool(Sandbox.from_config({"workers": 2})).run(["print(6*7)"] * 4)
    assert [(r.status, r.stdout) for r in results] == [("ok", "42\n")] * 4


@pytest.mark.parametrize("programs", [1, 4])
def test_a_batch_the_sandbox_refuses_stops_with_its_cause(monkeypatch, programs):
    monkeypatch.setattr(bwrap_module, "find_bwrap", lambda: "/nonexistent/bwrap")
    pool = WorkerPool(Sandbox(LIMITS), workers=2)
    with pytest.raises(SandboxRefused, match=rf"refused {programs} of {programs} programs.*"):
        pool.run(["print(1)"] * programs)


def test_a_batch_with_one_refusal_among_many_comes_back(monkeypatch):
    """One program the sandbox could not start (a broken zygote, say) is that program's
    result; only most of a batch stops the stage."""
    real_run = Sandbox.run

    def refuse_the_first(self, code, stdin="", **kwargs):
        if code == "print(0)":
            return SandboxResult("refused", "", "sandbox failed: gone", None, 0.0)
        return real_run(self, code, stdin, **kwargs)

    monkeypatch.setattr(Sandbox, "run", refuse_the_first)
    results = WorkerPool(Sandbox(LIMITS), workers=2).run([f"print({i})" for i in range(3)])
    assert [r.status for r in results] == ["refused", "ok", "ok"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root's sandbox needs no user namespace")
def test_a_host_that_forbids_user_namespaces_is_named_with_what_to_do(monkeypatch, tmp_path):
    """What bwrap says where unprivileged user namespaces are off (a sysctl, or a container's
    seccomp profile), and the hint the batch stops with."""
    fake = tmp_path / "bwrap"
    fake.write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to creating new namespace, likely because the"
        " kernel does not allow non-privileged user namespaces.' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(bwrap_module, "find_bwrap", lambda: str(fake))
    with pytest.raises(SandboxRefused, match=r"new namespace.*\(unprivileged user namespaces"):
        WorkerPool(Sandbox(LIMITS), workers=2).run(["print(1)"] * 3)

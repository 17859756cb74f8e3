"""Interpreter sessions: a trajectory's cells share one process and namespace, run once each.

A session's cell prints what the tool loop's re-run program (program_with_history: the
earlier cells re-run silently, then the cell) prints, tracebacks and limits included; what
tells the two apart is what a process cannot repeat (its pid, fresh random numbers, the
clock) and output an earlier cell wrote past sys.stdout, which a re-run writes again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from isolation import caller_of, sandbox_processes

from reasonrl.sandbox import Sandbox, SandboxLimits, bwrap_available, program_with_history
from reasonrl.sandbox.zygote import Zygote

pytestmark = [
    pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not installed"),
    pytest.mark.timeout(120),
]

FAST = SandboxLimits(cpu_seconds=1, wall_seconds=3, memory_mb=256, max_output_chars=1024)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(FAST)


def ours() -> list[int]:
    """Every process of a sandbox this process ran (zygotes and bwrap included)."""
    pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    return [pid for pid in pids if pid != os.getpid() and caller_of(pid) == os.getpid()]


def run_cells(sandbox: Sandbox, cells: list[str], history: list[str] | None = None):
    with sandbox.warm():
        session = sandbox.session(history or [])
        try:
            return [session.run(cell) for cell in cells]
        finally:
            session.close()


def test_cells_share_one_process_and_run_once(sandbox):
    results = run_cells(
        sandbox,
        [
            "n = 1",
            "n += 1\nprint(n)",
            "print(n)",
            "import os, random\nr = random.random()\nprint(os.getpid(), r)",
            "print(os.getpid(), r)",  # re-running the cell before would give another pid and r
        ],
    )
    assert [r.status for r in results] == ["ok"] * 5
    assert [r.stdout for r in results[:3]] == ["", "2\n", "2\n"]
    assert results[3].stdout == results[4].stdout


def test_a_cell_that_raised_leaves_its_state_and_its_output_is_its_own(sandbox):
    results = run_cells(
        sandbox,
        [
            "x = 1\nprint('first')\nraise ValueError('half-way')\nx = 99",
            "import os\nos.write(1, b'past sys.stdout\\n')\nprint(x)",
            "y = x + 1\n1 / 0",
            "print(x, y)",
        ],
    )
    assert [r.status for r in results] == ["error", "ok", "error", "ok"]
    assert results[0].stdout == "first\n" and "ValueError: half-way" in results[0].output
    assert results[1].stdout == "past sys.stdout\n1\n"
    # line 2 of the cell, after the re-run program's 2 + 5 * 2 lines that re-run cells 1 and 2
    assert "ZeroDivisionError" in results[2].output and 'main.py", line 14' in results[2].output
    # cell 2's os.write goes past the re-run's silenced sys.stdout: its re-run shows it again
    # (the session ended after cell 2, and cell 4 re-ran cells 1 to 3 in a new one)
    assert results[3].stdout == "past sys.stdout\n1 2\n"


def test_what_a_thread_writes_between_cells_is_no_cells_output(sandbox):
    late = (
        "import threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('late')), daemon=True).start()"
    )
    with sandbox.warm():
        session = sandbox.session()
        try:
            first = session.run(late)
            time.sleep(0.8)
            second = session.run("print('mine')")
        finally:
            session.close()
    assert first.stdout == "" and second.stdout == "mine\n"


def test_history_is_rerun_once_and_silently_past_sys_stdout_each_time(sandbox):
    history = ["seen = 1\nprint('history ran')", "seen += 1\nprint('no')"]
    pid_and_seen = "import os\nprint(os.getpid(), seen)"
    first, second = run_cells(sandbox, [pid_and_seen] * 2, history)
    assert first.stdout == second.stdout and first.stdout.endswith(" 2\n")  # one process
    # A history that writes past sys.stdout (os.write) is re-run for each cell, as the
    # program shows what it wrote each time.
    history = ["import os\nos.write(1, b'history ran\\n')\nseen = 1", "seen += 1\nprint('no')"]
    results = run_cells(sandbox, ["print(seen)", "print(seen)"], history)
    assert [r.stdout for r in results] == ["history ran\n2\n"] * 2


def test_cpu_time_counts_from_the_sessions_start_as_in_the_rerun_program(sandbox):
    spin = "import time\nend = time.process_time() + {}\nwhile time.process_time() < end: pass"
    with sandbox.warm():
        spinning, other = sandbox.session(), sandbox.session()
        try:
            # 0.4 s of CPU each: over the 1 s limit at the third, as its re-run program is
            spun = [spinning.run(spin.format(0.4)) for _ in range(3)]
            other.run("b = 'kept'")
            looping = spinning.run("while True: pass")
            after = other.run("print(b)")
        finally:
            spinning.close()
            other.close()
        rerun = sandbox.run(program_with_history([spin.format(0.4)] * 2, spin.format(0.4)))
    assert [r.status for r in spun] == ["ok", "ok", "timeout"] and rerun.status == "timeout"
    assert spun[2].output == rerun.output
    assert looping.status == "timeout" and looping.duration < FAST.wall_seconds
    assert after.status == "ok" and after.stdout == "kept\n"
    assert sandbox_processes() == []


def test_a_cells_wall_clock_is_what_the_earlier_cells_left_as_in_the_rerun_program():
    sleepy = Sandbox(SandboxLimits(cpu_seconds=1, wall_seconds=1, memory_mb=256))
    cells = ["import time\ntime.sleep(0.4)\nprint('slept')"] * 3
    with sleepy.warm():
        session = sleepy.session()
        try:
            slept = [session.run(cell) for cell in cells]
        finally:
            session.close()
        rerun = sleepy.run(program_with_history(cells[:2], cells[2]))
    # the third's re-run program sleeps 1.2 s: past its 1 s
    assert [r.status for r in slept] == ["ok", "ok", "timeout"] and rerun.status == "timeout"
    assert slept[2].output == rerun.output and slept[2].duration < 0.5


def test_a_cell_that_ignores_sigxcpu_is_killed_a_second_later(sandbox):
    ignoring = "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass"
    first, looping = run_cells(sandbox, ["x = 1", ignoring])
    assert first.status == "ok" and looping.status == "timeout"
    assert sandbox_processes() == []


def test_a_session_whose_process_ended_between_cells_replays_them_in_a_new_one(sandbox):
    ends_soon = (
        "import os, threading, time\nstarted = time.monotonic()\nx = 41\n"
        "ender = threading.Timer(0.5, os._exit, (0,))\nender.daemon = True\nender.start()"
    )
    with sandbox.warm():
        session = sandbox.session()
        try:
            assert session.run(ends_soon).status == "ok"
            time.sleep(1.0)  # the timer ends the process meanwhile
            again = session.run("x += 1\nprint(x, time.monotonic() - started < 0.5)")
        finally:
            session.close()
    assert again.status == "ok" and again.stdout == "42 True\n"  # a new process, a new start


def test_output_over_the_cap_found_after_a_cell_ended_ends_its_session(sandbox, monkeypatch):
    # A thread floods stdout just after its cell says it is done (the zygote is slow to end
    # the cell here), so the output limit is found while the cell's output is drained; not
    # on a silent re-run, where sys.stdout is a StringIO.
    floods_late = (
        "import io, sys, threading, time\n"
        "def flood():\n    time.sleep(0.1)\n    while True: print('x' * 4096, end='')\n"
        "if not isinstance(sys.stdout, io.StringIO):\n"
        "    threading.Thread(target=flood, daemon=True).start()"
    )
    end_cell = Zygote.end_cell

    def slow_end_cell(zygote: Zygote) -> int | None:
        status = end_cell(zygote)
        time.sleep(0.5)
        return status

    monkeypatch.setattr(Zygote, "end_cell", slow_end_cell)
    pid = "import os\nprint(os.getpid())"
    first, flooded, after = run_cells(sandbox, [pid, floods_late, pid])
    assert flooded.status == "output-limit"
    assert after.status == "ok" and after.stdout != first.stdout  # a new process


def test_a_forged_end_of_cell_does_not_cut_the_cell_short(sandbox):
    forges = (
        "import os, time\n"
        "for fd in map(int, os.listdir('/proc/self/fd')):\n"
        "    for forged in (b'0', b'0 0', b'1 0'):\n"
        "        try:\n            os.write(fd, forged)\n"
        "        except OSError:\n            pass\n"
        "time.sleep(1)\nprint('late')"
    )
    forged, after = run_cells(sandbox, [forges, "print('mine')"])
    assert forged.status == "ok" and forged.stdout.endswith("late\n")
    # (its os.write ended the session: the next cell re-runs it, as the program does)
    assert after.status == "ok" and after.stdout.endswith("mine\n")


def test_a_program_a_cell_runs_does_not_get_the_sessions_channel(sandbox):
    lists_fds = "import os\nprint(sorted(os.listdir('/proc/self/fd')))"
    command = f"[sys.executable, '-c', {lists_fds!r}]"
    runs = f"import subprocess, sys\nsubprocess.run({command}, close_fds=False)"
    (result,) = run_cells(sandbox, [runs])
    assert result.stdout == "['0', '1', '2', '3']\n"  # 3: the listing's own


def test_sessions_do_not_see_each_other(sandbox):
    with sandbox.warm():
        a, b = sandbox.session(), sandbox.session()
        try:
            a.run("secret = 1\nopen('/tmp/a-file', 'w').write('x')")
            seen = b.run("import os\nprint('secret' in globals(), sorted(os.listdir('/tmp')))")
        finally:
            a.close()
            b.close()
    assert seen.stdout == "False ['main.py']\n"


# In a cell: the live processes of the sandbox but the cell's own and the zygote, its init
# (zombies are left to their parent, the session's process, which never waited for them).
OTHERS_IN_CELL = (
    "import os\n"
    "def others():\n"
    "    found = []\n"
    "    for pid in (p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()):\n"
    "        try:\n"
    "            state = open(f'/proc/{pid}/stat').read().rpartition(')')[2].split()[0]\n"
    "        except OSError:\n"
    "            continue\n"
    "        found += [pid] if pid != '1' and state != 'Z' else []\n"
    "    return found\n"
)


def live(pids: list[int]) -> list[int]:
    """Those not zombies (the session's process never waited for its killed children)."""
    states = {}
    for pid in pids:
        try:
            states[pid] = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
    return [pid for pid, state in states.items() if state != "Z"]


def test_no_child_of_a_cell_outlives_it(sandbox):
    forks = (
        "import os\n"
        "if os.fork() == 0:\n    os.setsid()\n    while True: pass\n"
        "if os.fork() == 0:\n    os.setsid()\n    import time\n    time.sleep(60)\n"
        "print('started', len(others()))"
    )
    with sandbox.warm():
        session = sandbox.session([OTHERS_IN_CELL])
        try:
            started = session.run(forks)
            assert len(live(sandbox_processes())) == 1  # the session's process only
            after = session.run("print(others())")
        finally:
            session.close()
        assert sandbox_processes() == []
    assert started.stdout == "started 2\n"
    assert after.status == "ok" and after.stdout == "[]\n"
    assert ours() == []


def test_sessions_without_zygotes_replay_the_history_for_each_cell():
    plain = Sandbox(FAST, zygote=False)
    session = plain.session()
    results = [session.run(cell) for cell in ("n = 1", "n += 1\nprint(n)", "print(n)")]
    session.close()
    assert [r.stdout for r in results] == ["", "2\n", "2\n"]


# A session's cell prints what the tool loop's re-run program (program_with_history) prints
# for the same history and cell: status, output (tracebacks and their line numbers, the
# SyntaxError's shape, the limits' notes) and exit code. Each history runs in a session opened
# with no history (every cell live) and in one opened after its first cell (which replays it,
# as the rollout opens one), and every cell from there on is checked against the re-run.
SAME_AS_RERUN = {
    "name from an earlier cell that raised": [
        "x = 1\nraise ValueError('boom')\ny = 2",
        "print(x)\nprint(y)",
    ],
    "ZeroDivisionError at line 3": ["a = 1", "b = 2\nc = 3\nprint(a / 0)"],
    "SyntaxError in the new cell": ["a = 1", "print(a\nb = (1,", "print(a)"],
    "IndentationError in the new cell": ["a = 1", "if a:\nprint(a)"],
    "SyntaxError in an earlier cell": ["def f(:\n    pass", "a = 1", "print(a)\nf()"],
    "print and stderr in an earlier cell": [
        "import sys\nprint('old')\nprint('old err', file=sys.stderr)\nv = 5",
        "print(v)",
    ],
    "sys.exit in the new cell": ["a = 1", "import sys\nprint(a)\nsys.exit(3)"],
    "sys.exit with a message": ["a = 1", "import sys\nsys.exit('bad input')"],
    "sys.exit in an earlier cell": ["import sys\nx = 1\nsys.exit(2)\nx = 3", "print(x)"],
    "def in cell 1 raises in cell 3": [
        "def f(n):\n    return 10 / n",
        "g = 2",
        "print(f(g))\nprint(f(0))",
    ],
    "def raising in its own cell and in a later one": [
        "def f():\n    raise ValueError('v')\n\nf()",
        "f()",
    ],
    "closure of an earlier cell": [
        "def outer():\n    def inner():\n        return 1 / 0\n    return inner\n\ng = outer()",
        "g()",
    ],
    "generator of an earlier cell": [
        "def gen():\n    yield 1\n    yield 1 / 0\n\ng = gen()\nprint(next(g))",
        "print(next(g))",
        "print(next(g, 'done'))",
    ],
    "warning from an earlier def": [
        "import warnings\ndef w():\n    warnings.warn('from w')",
        "w()\nprint('after')",
        "w()",
    ],
    "seeded random numbers": [
        "import random\nrandom.seed(0)\na = random.random()",
        "print(random.random())",
    ],
    "method of an earlier class": [
        "class A:\n    def m(self):\n        raise KeyError('k')",
        "A().m()",
    ],
    "lambda of an earlier cell": ["f = lambda v: v[5]", "print(f([1]))"],
    "defs and calls in the new cell": [
        "x = 0",
        "def g():\n    return 1 / x\n\ndef h():\n    return g()\n\nh()",
        "h()",
    ],
    "imports": [
        "import math\nfrom collections import Counter",
        "print(math.sqrt(16), Counter('aab'))",
    ],
    "recursion from an earlier def": ["def r(n):\n    return r(n + 1)", "r(0)"],
    "recursion in the new cell": ["n = 0", "def r(k):\n    return r(k + 1)\n\nr(n)"],
    "warnings": ["import warnings", "warnings.warn('careful')\nprint('done')"],
    "SyntaxWarning": ["x = 1", "print(x is 1)"],
    "from __future__ in an earlier cell": ["from __future__ import annotations\nx = 1", "print(x)"],
    "docstring of an earlier cell": ['"""the doc"""\nx = 1', "print(__doc__, x)"],
    "builtins shadowed by an earlier cell": ["from re import compile", "x = 41", "print(x + 1)"],
    "builtins the session's runner uses, shadowed": [
        "getattr = any = all = len = type = zip = id = isinstance = open = int = None\n"
        "set = map = bool = None\nx = 1",
        "def f():\n    return x\n\nprint(f())",
        "print(f() + 1)",
    ],
    "os.write in an earlier cell": [
        "import os\nos.write(1, b'past sys.stdout\\n')\nv = 1",
        "print(v)",
        "print(v + 1)",
    ],
    "a subprocess's output in an earlier cell": [
        "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'print(7)'])",
        "print('after')",
    ],
    "sys.stdout.buffer in an earlier cell": [
        "import sys\nsys.stdout.buffer.write(b'raw\\n')\nw = 2",
        "print(w)",
    ],
    "sys.stdout replaced by an earlier cell": [
        "import io, sys\nbuf = io.StringIO()\nsys.stdout = buf\nprint('hidden')",
        "print('visible')",
        "print(repr(buf.getvalue()))",
    ],
    "the re-run's own names": ["_c = 5\n_io = 6", "print(_io)", "print(_c)"],
    "atexit in an earlier cell": ["import atexit\natexit.register(print, 'bye')", "print('x')"],
    "KeyboardInterrupt": ["a = 1", "raise KeyboardInterrupt", "print(a)"],
    "input at EOF": ["a = 1", "print(input())"],
    "output over the cap": ["big = 'y' * 5000", "print(big)", "print(len(big))"],
    "null byte": ["a = 1", "print(a)\0", "print(a)"],
}


def _rerun(sandbox: Sandbox, history: list[str], cell: str):
    return sandbox.run(program_with_history(history, cell))


@pytest.mark.parametrize("name", list(SAME_AS_RERUN))
def test_a_sessions_cells_print_what_the_rerun_prints(sandbox, name):
    cells = SAME_AS_RERUN[name]
    with sandbox.warm():
        expected = [_rerun(sandbox, cells[:i], cells[i]) for i in range(len(cells))]
        for opened_at in (0, 1):
            session = sandbox.session(cells[:opened_at])
            try:
                got = [session.run(cell) for cell in cells[opened_at:]]
            finally:
                session.close()
            for want, have in zip(expected[opened_at:], got, strict=True):
                assert (have.status, have.output, have.returncode) == (
                    want.status,
                    want.output,
                    want.returncode,
                ), (opened_at, have.stderr, want.stderr)

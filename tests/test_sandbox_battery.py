"""Adversarial battery: programs that try to get out, each contained with no trace on the host.

Every case is a program in one category of attack. It prints CONTAINED for each attempt that
failed as it must and ESCAPED for one that worked; the test checks the printed verdicts and
the run's status, and then, outside, that the host shows no side effect: no file named with
the case's marker anywhere the program aimed at, no process left behind (no child of ours,
no process of a sandbox uid, no zombie), the caller's environment unchanged, no signal
received by the caller, and no contact on the loopback TCP, UDP and unix servers the test
runs for the programs to find.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_sandbox import sandbox_processes

from reasonrl.sandbox import Sandbox, SandboxLimits
from reasonrl.sandbox.cgroups import memory_parent
from reasonrl.sandbox.pool import Program, WorkerPool

pytestmark = pytest.mark.timeout(120)

PROJECT_DIR = Path(__file__).resolve().parent.parent
HOME = Path.home()
FAST = SandboxLimits(cpu_seconds=1, wall_seconds=3, memory_mb=256, max_output_chars=1024)
WITNESSED_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
SECRET_NAME = "REASONRL_BATTERY_SECRET"


@dataclass(frozen=True)
class Case:
    category: str
    name: str
    code: str  # str.format fields: port udp_port abstract unix_path caller_pid marker secret
    statuses: tuple[str, ...] = ("ok",)
    contained: int = 1  # CONTAINED lines the program must print (0: judged by status and host)
    limits: SandboxLimits = FAST
    needs_memory_group: bool = False  # what only a memory cgroup contains (root's, here)


# An attempt helper every program starts with: run `action`; if it raises, the attempt failed.
PRELUDE = """\
import os, sys, socket, ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
def attempt(label, action):
    try:
        result = action()
    except BaseException as exc:
        print("CONTAINED", label, type(exc).__name__, exc)
        return
    print("ESCAPED", label, result)
def libc_fails(label, func, *args):
    res = func(*args)
    verdict = "CONTAINED" if res == -1 else "ESCAPED"
    print(verdict, label, res, errno.errorcode.get(ctypes.get_errno()))
def syscall_fails(label, number, *args):
    libc_fails(label, libc.syscall, number, *args)
def signal_init(label, signum, pid=1):
    # Contained: refused (root's init, another uid), or delivered to nothing (without root
    # the init shares our uid and the kernel drops what its handlers do not take); the init
    # then still runs, not stopped (had it died, so would this program, before its verdict).
    try:
        os.kill(pid, signum)
    except OSError as exc:
        print("CONTAINED", label, type(exc).__name__, exc)
        return
    import time
    time.sleep(0.05)
    state = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[0]
    print("CONTAINED" if state in "RS" else "ESCAPED", label, "sent, init is", state)
"""

CASES = [
    # --- network --------------------------------------------------------------------------
    Case("network", "tcp-loopback-server",
         "attempt('tcp', lambda: socket.create_connection(('127.0.0.1', {port}), timeout=1))"),
    Case("network", "tcp-internet",
         "attempt('tcp', lambda: socket.create_connection(('1.1.1.1', 80), timeout=1))"),
    Case("network", "dns",
         "attempt('dns', lambda: socket.getaddrinfo('example.com', 80))\n"
         "attempt('resolver', lambda: open('/etc/resolv.conf').read())", contained=2),
    Case("network", "http-loopback-server",
         "import urllib.request\n"
         "attempt('http', lambda: urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=1))"),
    Case("network", "udp-loopback-server",  # sending works inside; the host must not receive
         "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
         "for _ in range(20):\n"
         "    try:\n"
         "        s.sendto(b'{marker}', ('127.0.0.1', {udp_port}))\n"
         "    except OSError:\n"
         "        pass\n", contained=0),
    Case("network", "unix-sockets-of-the-host",
         "def connect(address):\n"
         "    s = socket.socket(socket.AF_UNIX)\n"
         "    s.connect(address)\n"
         "attempt('abstract', lambda: connect('\\0{abstract}'))\n"
         "attempt('path', lambda: connect('{unix_path}'))", contained=2),
    Case("network", "raw-and-netlink-sockets",
         "attempt('packet', lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))\n"
         "attempt('netlink', lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW))\n"
         "attempt('raw-ip', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, 1))",
         contained=3),
    Case("network", "only-loopback-interface",
         "names = [line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]]\n"
         "print('CONTAINED' if names == ['lo'] else 'ESCAPED', names)"),
    # --- host secrets ---------------------------------------------------------------------
    Case("secrets", "caller-environment",
         "import glob\n"
         "found = [k for k, v in os.environ.items() if '{secret}' in v or k == '{secret_name}']\n"
         "for path in glob.glob('/proc/*/environ'):\n"
         "    try:\n"
         "        found += [path] if b'{secret}' in open(path, 'rb').read() else []\n"
         "    except OSError:\n"
         "        pass\n"
         "print('ESCAPED' if found else 'CONTAINED', found, sorted(os.environ))"),
    Case("secrets", "home-folder",
         "attempt('history', lambda: open('{home}/.bash_history').read())\n"
         "attempt('ssh', lambda: os.listdir('{home}/.ssh'))\n"
         "attempt('listing', lambda: [n for n in os.listdir('{home}') if n != '.pyenv'] or 1/0)",
         contained=3),
    Case("secrets", "other-processes-in-proc",
         "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
         "print('CONTAINED' if max(pids) < 100 else 'ESCAPED', pids)\n"
         "attempt('caller', lambda: open('/proc/{caller_pid}/cmdline').read() or 1/0)\n"
         "attempt('init-environ', lambda: open('/proc/1/environ').read() or 1/0)", contained=3),
    Case("secrets", "project-files",
         "attempt('pyproject', lambda: open('{project}/pyproject.toml').read())\n"
         "attempt('git', lambda: os.listdir('{project}/.git'))\n"
         "attempt('venv', lambda: os.listdir('{project}/.venv'))", contained=3),
    Case("secrets", "system-secrets",
         "attempt('shadow', lambda: open('/etc/shadow').read())\n"
         "attempt('ssh-host-key', lambda: os.listdir('/etc/ssh'))\n"
         "attempt('kcore', lambda: open('/proc/kcore', 'rb').read(16))", contained=3),
    # --- writes outside the private /tmp --------------------------------------------------
    Case("writes", "system-folders",
         "for folder in ('/usr', '/etc', '/', '/root', '/proc'):\n"
         "    attempt(folder, lambda: open(folder + '/{marker}', 'w').write('x'))", contained=5),
    Case("writes", "project-home-and-host-tmp",
         "for folder in ('{project}', '{home}', '{host_tmp}'):\n"
         "    attempt(folder, lambda: open(folder + '/{marker}', 'w').write('x'))", contained=3),
    Case("writes", "kernel-knobs",
         "attempt('hostname', lambda: open('/proc/sys/kernel/hostname', 'w').write('x'))\n"
         "attempt('sysrq', lambda: open('/proc/sysrq-trigger', 'w').write('h'))\n"
         "attempt('core-pattern', lambda: open('/proc/sys/kernel/core_pattern', 'w').write('|x'))",
         contained=3),
    # --- escape and persistence -----------------------------------------------------------
    Case("escape", "daemon-double-fork-setsid",
         "import time\n"
         "if os.fork() == 0:\n"
         "    os.setsid()\n"
         "    if os.fork() == 0:\n"
         "        time.sleep(30)\n"
         "        open('/tmp/{marker}', 'w').write('still here')\n"
         "    os._exit(0)\n"
         "print('parent done')", contained=0),
    Case("escape", "orphan-ignoring-signals",
         "import signal\n"
         "if os.fork() == 0:\n"
         "    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):\n"
         "        signal.signal(s, signal.SIG_IGN)\n"
         "    while True:\n"
         "        pass\n"
         "print('left a spinning child')", contained=0),
    Case("escape", "signal-parent-and-caller",  # init: refused as root, dropped without it
         "import signal\n"
         "signal_init('init', signal.SIGKILL)\n"
         "signal_init('parent', signal.SIGKILL, os.getppid())\n"
         "signal_init('stop', signal.SIGSTOP)\n"
         "signal_init('interrupt', signal.SIGINT)\n"
         "attempt('caller', lambda: os.kill({caller_pid}, signal.SIGTERM))\n"
         "attempt('caller-group', lambda: os.killpg({caller_pid}, signal.SIGHUP))", contained=6),
    Case("escape", "terminal-injection",  # TIOCSTI pushes keystrokes into a host terminal
         "import fcntl, termios\n"
         "for fd in (0, 1, 2):\n"
         "    attempt(f'tiocsti-{{fd}}', lambda: fcntl.ioctl(fd, termios.TIOCSTI, b'x'))\n"
         "attempt('tty', lambda: fcntl.ioctl(os.open('/dev/tty', 2), termios.TIOCSTI, b'x'))",
         contained=4),
    Case("escape", "sandbox-uid-locks-and-host-tmp",
         "attempt('locks', lambda: os.listdir('/tmp/reasonrl-sandbox-uids'))\n"
         "attempt('lock-file', lambda: open('/tmp/reasonrl-sandbox-uids/2100000000.lock', 'w'))\n"
         "attempt('host-tmp', lambda: os.listdir('{host_tmp}'))", contained=3),
    Case("escape", "kill-everything-it-can",
         "import signal\nos.kill(-1, signal.SIGKILL)\nprint('survived')",
         statuses=("error",), contained=0),
    Case("escape", "ptrace-caller",
         "libc_fails('attach-caller', libc.ptrace, 16, {caller_pid}, 0, 0)\n"
         "libc_fails('attach-init', libc.ptrace, 16, 1, 0, 0)\n"
         "libc_fails('traceme', libc.ptrace, 0, 0, 0, 0)", contained=3),
    # --- fork bomb, memory bomb, CPU spin -------------------------------------------------
    Case("fork-bomb", "classic",
         "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
         statuses=("timeout",), contained=0),
    Case("fork-bomb", "threads",
         "import threading, time\n"
         "while True:\n"
         "    try:\n"
         "        threading.Thread(target=time.sleep, args=(60,)).start()\n"
         "    except RuntimeError:\n"
         "        pass", statuses=("timeout",), contained=0),
    Case("memory-bomb", "one-huge-allocation", "bytearray(4 * 1024**3)", statuses=("memory",),
         contained=0),
    Case("memory-bomb", "gradual-growth",
         "chunks = []\nwhile True:\n    chunks.append(bytearray(32 * 1024**2))",
         statuses=("memory",), contained=0),
    Case("memory-bomb", "forked-children-together",  # each under the per-process cap
         "kids = []\n"
         "for _ in range(4):\n"
         "    pid = os.fork()\n"
         "    if pid == 0:\n"
         "        block = bytearray(150 * 1024**2)\n"
         "        for i in range(0, len(block), 4096):\n"
         "            block[i] = 1\n"
         "        import time; time.sleep(0.5)\n"
         "        os._exit(0)\n"
         "    kids.append(pid)\n"
         "codes = [os.waitpid(k, 0)[1] for k in kids]\n"
         "print('CONTAINED' if any(codes) else 'ESCAPED', codes)", needs_memory_group=True),
    Case("cpu-spin", "busy-loop", "while True:\n    pass", statuses=("timeout",), contained=0),
    Case("cpu-spin", "threads",
         "import threading\n"
         "def spin():\n    while True:\n        pass\n"
         "for _ in range(4):\n    threading.Thread(target=spin).start()",
         statuses=("timeout",), contained=0),
    Case("cpu-spin", "ignores-sigxcpu",
         "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass",
         statuses=("timeout",), contained=0),
    # --- disk fill ------------------------------------------------------------------------
    Case("disk-fill", "one-big-file-in-tmp",
         "def fill():\n"
         "    with open('/tmp/{marker}', 'wb') as f:\n"
         "        while True:\n"
         "            f.write(b'x' * 1024**2)\n"
         "attempt('tmp', fill)"),
    Case("disk-fill", "many-files-in-tmp",
         "def fill():\n"
         "    for i in range(10**6):\n"
         "        open(f'/tmp/{marker}-{{i}}', 'wb').write(b'x' * 8192)\n"
         "attempt('tmp', fill)"),
    Case("disk-fill", "dev-shm",
         "def fill():\n"
         "    with open('/dev/shm/{marker}', 'wb') as f:\n"
         "        while True:\n"
         "            f.write(b'x' * 1024**2)\n"
         "attempt('shm', fill)"),
    # --- output ---------------------------------------------------------------------------
    Case("output", "stdout-flood", "while True:\n    print('x' * 1000)",
         statuses=("output-limit",), contained=0),
    Case("output", "stderr-flood", "while True:\n    sys.stderr.write('e' * 1000)",
         statuses=("output-limit",), contained=0),
    Case("output", "both-streams-flood",
         "while True:\n    sys.stdout.write('o' * 500)\n    sys.stderr.write('e' * 500)",
         statuses=("output-limit",), contained=0),
    Case("output", "one-very-long-line", "sys.stdout.write('y' * 50_000_000)",
         statuses=("output-limit",), contained=0),
    Case("output", "binary-bytes",
         "os.write(1, bytes(range(256)) * 3 + b'\\x1b[2J\\x00\\xff\\xfe')", contained=0),
    # --- deep recursion -------------------------------------------------------------------
    Case("recursion", "default-limit", "def f(n):\n    return f(n + 1)\nf(0)",
         statuses=("error",), contained=0),
    Case("recursion", "limit-removed-overflows-the-c-stack",
         "sys.setrecursionlimit(10**8)\ndef f(n):\n    return f(n + 1) + 1\nf(0)",
         statuses=("error", "timeout"), contained=0),  # a segfault, unless the CPU cap is first
    # --- ctypes and system calls ----------------------------------------------------------
    Case("syscalls", "namespaces",
         "libc_fails('unshare-user', libc.unshare, 0x10000000)\n"
         "libc_fails('unshare-net', libc.unshare, 0x40000000)\n"
         "libc_fails('setns', libc.setns, 0, 0)\n"
         "syscall_fails('clone3', 435, 0, 0)\n"
         "syscall_fails('clone-newuser', 56, 0x10000000 | 17, 0, 0, 0, 0)", contained=5),
    Case("syscalls", "mount-and-chroot",
         "libc_fails('mount', libc.mount, b'none', b'/tmp', b'tmpfs', 0, None)\n"
         "libc_fails('remount-usr', libc.mount, None, b'/usr', None, 32 | 4096, None)\n"
         "libc_fails('chroot', libc.chroot, b'/tmp')", contained=3),
    Case("syscalls", "privilege",
         "libc_fails('setuid-root', libc.setuid, 0)\n"
         "libc_fails('setgid-root', libc.setgid, 0)\n"
         "attempt('cap-raise', lambda: os.setgroups([0]))", contained=3),
    Case("syscalls", "kernel-interfaces",
         "syscall_fails('bpf', 321, 0, 0, 0)\n"
         "syscall_fails('io_uring_setup', 425, 1, 0)\n"
         "syscall_fails('keyctl', 250, 0, 0)\n"
         "syscall_fails('perf_event_open', 298, 0, 0, -1, -1, 0)\n"
         "syscall_fails('userfaultfd', 323, 0)\n"
         "syscall_fails('process_vm_readv', 310, 1, 0, 0, 0, 0, 0)", contained=6),
    Case("syscalls", "raise-own-limits",
         "import resource as r\n"
         "for name in ('RLIMIT_NPROC', 'RLIMIT_CPU', 'RLIMIT_AS', 'RLIMIT_FSIZE'):\n"
         "    kind = getattr(r, name)\n"
         "    attempt(name, lambda: r.setrlimit(kind, (r.RLIM_INFINITY, r.RLIM_INFINITY)))",
         contained=4),
    Case("syscalls", "null-pointer", "ctypes.string_at(0)", statuses=("error",), contained=0),
    # --- symlinks -------------------------------------------------------------------------
    Case("symlinks", "links-to-host-paths",
         "os.symlink('{host_tmp}', '/tmp/to-host')\n"
         "os.symlink('{project}', '/tmp/to-project')\n"
         "attempt('host-tmp', lambda: open('/tmp/to-host/{marker}', 'w').write('x'))\n"
         "attempt('project', lambda: os.listdir('/tmp/to-project'))\n"
         "attempt('hardlink', lambda: os.link('/usr/bin/env', '/tmp/env'))", contained=3),
    Case("symlinks", "proc-root-links",
         "attempt('init-root', lambda: os.listdir('/proc/1/root'))\n"
         "attempt('init-cwd', lambda: os.listdir('/proc/1/cwd'))\n"
         "attempt('caller-root', lambda: os.listdir('/proc/{caller_pid}/root'))\n"
         "own = sorted(os.listdir('/proc/self/root/../..'))\n"
         "print('CONTAINED' if own == sorted(os.listdir('/')) else 'ESCAPED', own)", contained=4),
    # --- /dev and /sys --------------------------------------------------------------------
    Case("dev-sys", "devices",
         "allowed = {{'null', 'zero', 'full', 'random', 'urandom', 'tty', 'ptmx', 'pts', 'shm',\n"
         "           'fd', 'stdin', 'stdout', 'stderr', 'core'}}\n"
         "extra = sorted(set(os.listdir('/dev')) - allowed)\n"
         "print('ESCAPED' if extra else 'CONTAINED', extra)\n"
         "for dev in ('/dev/mem', '/dev/kmsg', '/dev/sda', '/dev/vda', '/dev/kvm'):\n"
         "    attempt(dev, lambda: open(dev, 'rb').read(1))\n"
         "attempt('tty', lambda: open('/dev/tty', 'w').write('x'))", contained=7),
    Case("dev-sys", "cgroup-writes",
         "attempt('procs', lambda: open('/sys/fs/cgroup/cgroup.procs', 'w').write('1'))\n"
         "attempt('release-agent', lambda: open('/sys/fs/cgroup/release_agent', 'w').write('x'))",
         contained=2),
    Case("dev-sys", "sysfs",
         "attempt('sys', lambda: os.listdir('/sys'))\n"
         "attempt('cgroup', lambda: os.listdir('/sys/fs/cgroup'))\n"
         "attempt('kmsg', lambda: open('/proc/kmsg', 'rb').read(1))", contained=3),
]  # fmt: skip


class LoopbackWitness:
    """TCP, UDP, abstract and path unix servers on the host; records every contact."""

    def __init__(self, folder: Path) -> None:
        self.contacts: list[str] = []
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.abstract_name = f"reasonrl-battery-{os.getpid()}"
        self.abstract = socket.socket(socket.AF_UNIX)
        self.abstract.bind("\0" + self.abstract_name)
        self.abstract.listen()
        self.unix_path = str(folder / "witness.sock")
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.unix_path)
        self.unix.listen()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        import selectors

        with selectors.DefaultSelector() as selector:
            for name in ("tcp", "udp", "abstract", "unix"):
                selector.register(getattr(self, name), selectors.EVENT_READ, name)
            while not self.stop.is_set():
                for key, _ in selector.select(0.1):
                    if key.data == "udp":
                        self.contacts.append(f"udp {self.udp.recvfrom(4096)}")
                    else:
                        connection, address = key.fileobj.accept()
                        connection.close()
                        self.contacts.append(f"{key.data} {address}")

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for name in ("tcp", "udp", "abstract", "unix"):
            getattr(self, name).close()


@pytest.fixture(scope="module")
def witness(tmp_path_factory):
    server = LoopbackWitness(tmp_path_factory.mktemp("witness"))
    yield server
    server.close()


@pytest.fixture
def signals_received():
    received: list[int] = []
    previous = {s: signal.signal(s, lambda n, _: received.append(n)) for s in WITNESSED_SIGNALS}
    yield received
    for number, handler in previous.items():
        signal.signal(number, handler)


def children_of(pid: int) -> set[int]:
    children = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children.update(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return children


def files_named(marker: str, folders: list[Path]) -> list[str]:
    """Paths whose name holds marker, at the top level of each folder."""
    found = []
    for folder in folders:
        try:
            found += [str(p) for p in folder.iterdir() if marker in p.name]
        except OSError:
            continue
    return found


def format_case(case: Case, witness: LoopbackWitness, host_tmp: Path, marker: str) -> str:
    body = case.code.format(
        port=witness.tcp.getsockname()[1],
        udp_port=witness.udp.getsockname()[1],
        abstract=witness.abstract_name,
        unix_path=witness.unix_path,
        caller_pid=os.getpid(),
        marker=marker,
        secret=os.environ[SECRET_NAME],
        secret_name=SECRET_NAME,
        home=HOME,
        project=PROJECT_DIR,
        host_tmp=host_tmp,
    )
    return PRELUDE + body + "\n"


def assert_host_untouched(marker, host_tmp, witness, signals, environ, children_before):
    folders = [Path("/"), Path("/tmp"), Path("/usr"), Path("/etc"), HOME, PROJECT_DIR, host_tmp]
    assert files_named(marker, folders) == []
    assert sandbox_processes() == []
    assert children_of(os.getpid()) <= children_before
    assert dict(os.environ) == environ
    assert witness.contacts == []
    assert signals == []
    leftover = list(Path("/tmp").glob(f"reasonrl-sandbox-{os.getpid()}-*"))
    assert leftover == []


@pytest.mark.parametrize("warm", [False, True], ids=["own-sandbox", "warm-zygote"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c.category}-{c.name}" for c in CASES])
def test_adversarial_program_is_contained(
    case, warm, witness, signals_received, tmp_path, monkeypatch
):
    """In a sandbox of its own (a single run), and forked by a warm zygote (as in a batch)
    that has run a program before it."""
    if case.needs_memory_group and memory_parent() is None:
        pytest.skip(
            "needs a memory cgroup of ours (root's here): without one memory_mb caps "
            "each process, as the sandbox says"
        )
    monkeypatch.setenv(SECRET_NAME, "s3cr3t-" + os.urandom(6).hex())
    marker = f"reasonrl-battery-{case.name}-{os.getpid()}"
    environ = dict(os.environ)
    children_before = children_of(os.getpid())
    sandbox = Sandbox(case.limits)
    with sandbox.warm() if warm else contextlib.nullcontext():
        if warm:
            assert sandbox.run("pass").status == "ok"
        result = sandbox.run(format_case(case, witness, tmp_path, marker))
    assert result.status in case.statuses, result
    assert "ESCAPED" not in result.stdout, result.stdout
    assert result.stdout.count("CONTAINED") >= case.contained, result
    assert len(result.stdout) <= case.limits.max_output_chars
    assert len(result.stderr) <= case.limits.max_output_chars
    assert result.duration < case.limits.wall_seconds + 2
    assert_host_untouched(marker, tmp_path, witness, signals_received, environ, children_before)


def test_battery_covers_every_category():
    categories = {case.category for case in CASES}
    assert categories == {
        "network", "secrets", "writes", "escape", "fork-bomb", "memory-bomb", "cpu-spin",
        "disk-fill", "output", "recursion", "syscalls", "symlinks", "dev-sys",
    }  # fmt: skip
    assert len(CASES) >= 30


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: memory cgroups are root's here")
def test_memory_cap_holds_for_the_processes_together():
    """This machine kind lets root make memory cgroups: the forked-children case relies on it."""
    assert memory_parent() is not None


def test_a_bomb_does_not_starve_the_program_beside_it(witness, tmp_path, monkeypatch):
    """A fork bomb and a memory bomb run beside a program that needs processes and memory:
    each sandbox has its own uid (RLIMIT_NPROC counts per uid) and its own memory group."""
    neighbour = (
        "import subprocess\n"
        "procs = [subprocess.Popen(['sleep', '0.5']) for _ in range(8)]\n"
        "print(sum(p.wait() == 0 for p in procs), len(bytearray(100 * 1024**2)))\n"
    )
    marker = f"reasonrl-battery-neighbour-{os.getpid()}"
    monkeypatch.setenv(SECRET_NAME, "unused")
    classic = next(case for case in CASES if case.name == "classic")
    fork_bomb = format_case(classic, witness, tmp_path, marker)
    memory_bomb = "chunks = []\nwhile True:\n    chunks.append(bytearray(32 * 1024**2))"
    programs = [Program(fork_bomb), Program(memory_bomb), Program(neighbour)]
    results = WorkerPool(Sandbox(FAST), workers=3).run(programs)
    assert [r.status for r in results] == ["timeout", "memory", "ok"], results
    assert results[2].stdout == f"8 {100 * 1024**2}\n"
    assert sandbox_processes() == []

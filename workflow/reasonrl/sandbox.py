"""Run model-written Python under bubblewrap with resource limits, and report what happened.

Each program runs in a fresh sandbox: no network, a read-only view of /usr and of the
Python interpreter's own prefix, a private size-capped /tmp and /dev/shm, new pid, ipc and
uts namespaces, a new session and a seccomp filter that refuses the system calls a Python
program has no use for (namespaces, mounts, ptrace, keyrings, bpf, io_uring, raw sockets).
Inside, a tiny bootstrap joins the run's memory cgroup (when the host lets us make one, so
the memory cap holds for all of the program's processes together), sets the rlimits (CPU
seconds, address space, processes, file size, no core files), drops root to a uid of its
own (RLIMIT_NPROC does not bind root, and counts per uid: a fork bomb in one sandbox must
not starve the one beside it) and runs the program in that same interpreter (standard
library only, unless site-packages are asked for), in a child of its own: the bootstrap
itself stays the namespace's init, holding none of the program's descriptors.

Without root the same runs go through an unprivileged user namespace per sandbox: the
program keeps the runner's uid (RLIMIT_NPROC then counts that namespace's processes, so the
cap is still per sandbox), the sandbox's init and the code checker are non-dumpable (nothing
of theirs is open to it through /proc) and ignore the signals they can, and the memory cap is
per process unless a memory cgroup can be made. GUARANTEES says what is weaker; it is said
once, and `sandbox.require` refuses to run without it. The caller reads output incrementally,
enforces the wall clock, the output cap and cancellation, and classifies the end as one of
STATUSES. Nothing the program does raises in the caller.

In a pool's batch (sandbox.zygote, the default) a program does not start its own bwrap and
interpreter: a warm interpreter in one such sandbox per pool worker forks it and does the same
set-up in the child (reasonrl.zygote); the caller's side, its supervision and its results are
the same.

A Session (the tool loop's notebook) keeps one such forked process alive across cells, so a
cell never re-runs the ones before it, and prints what re-running them would have printed.

bwrap's outer process exits as soon as the program's exit status is known, before the
sandbox's pid 1 (the bootstrap's init, or a zygote) has exited; that pid 1 would be
reparented to the host's init, which in a container may never reap it. So while runs are in
progress the caller is a child subreaper (orphans of its descendants come to it rather than
to init), and each run reaps its pid 1 through a pidfd opened while it was alive: no zombie
outlives a run.
"""

from __future__ import annotations

import codecs
import contextlib
import copy
import fcntl
import json
import logging
import math
import os
import secrets
import selectors
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import BinaryIO

from reasonrl import seccomp
from reasonrl.cgroups import MemoryGroup, memory_parent, owner_is_gone
from reasonrl.errors import ReasonRLError
from reasonrl.subreaper import as_subreaper
from reasonrl.zygote import (
    CONFINE_SOURCE,
    PRELOADED_MODULES,
    SCRIPT_NAME,
    ZYGOTE_SOURCE,
    WarmZygotes,
    Zygote,
    ZygoteBroken,
)

STATUSES = ("ok", "error", "timeout", "memory", "output-limit", "refused", "cancelled")

BWRAP_MISSING = (
    "bubblewrap (bwrap) not found: install it (apt-get install bubblewrap) or set "
    "sandbox.allow_unsandboxed: true to run model code without isolation"
)
UNSANDBOXED_WARNING = (
    "sandbox.allow_unsandboxed: running model code WITHOUT bubblewrap isolation "
    "(network, files and process count are not contained); install bubblewrap"
)

# What holds only as root or with a memory cgroup of ours, and what holds instead: said once a
# process (weaker_guarantees), refused under sandbox.require.
GUARANTEES = {
    "own_uid": (
        "a uid of its own per sandbox (needs root)",
        "programs run as the runner's uid, each sandbox in a user and pid namespace of its own "
        "(RLIMIT_NPROC counts there), its init non-dumpable",
    ),
    "memory_group": (
        "one memory cap for all of a program's processes (needs a memory cgroup we may create)",
        "memory_mb caps each process (RLIMIT_AS), not all of a program's together",
    ),
}
_said: set[str] = set()
_log = logging.getLogger(__name__)

# Uids (and gids) the sandboxed programs run as when we are root: one per running sandbox,
# held by a lock file so that concurrent processes on one host never share one.
SANDBOX_UIDS = range(2_100_000_000, 2_100_000_000 + 1024)
UID_LOCK_DIR = Path(tempfile.gettempdir()) / "reasonrl-sandbox-uids"
HOST_DIR_PREFIX = "reasonrl-sandbox-"  # + the caller's pid: host folder of one run
SANDBOX_SCRIPT = "/tmp/main.py"
_READ_CHUNK = 65536
_KILL_GRACE_SECONDS = 2.0
_ZYGOTE_KILL_GRACE_SECONDS = 5.0  # a zygote kills every process of the program, then answers
_MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory", "out of memory")
# The kernel charges CPU time by whole scheduler ticks, so a program can reach its CPU limit a
# tick or so before our wall clock shows that much time (seen: SIGKILL at 1.9988 s of wall
# clock under a 2 s hard limit, in CI).
_CPU_ACCOUNTING_SLACK_SECONDS = 0.05
_TAIL_LINES = 5
_STALE_READS = 64  # at most this many chunks of a session's between-cells output are skipped
_STDERR_FLOOD_FACTOR = 64  # stderr may exceed the kept cap this many times over
_TRACEBACK_HEADER = "Traceback (most recent call last):"
_PROGRAM_FILE_MARK = 'main.py", line '  # how a traceback names a frame of the program itself

# In bwrap the bootstrap is the pid namespace's init (--as-pid-1) and runs the program in a
# child: bwrap's own init would keep the program's stdin (a code check's tests) and output
# pipes open, and without root it runs as the program's uid, so its /proc/1/fd, mem and
# environ would be the program's to read. This init is non-dumpable, ignores SIGINT (the only
# signal it handles), holds no descriptor, and exits with the program's status once its main
# process has ended (a signal as 128 + its number, as bwrap reports one); the kernel then
# kills what is left in the namespace.
_INIT_SOURCE = """\
if init:
    import ctypes, signal
    if ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, 0 (the child's too)
        os._exit(125)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    go, went = os.pipe()
    program = os.fork()
    if program:
        os.closerange(0, os.sysconf("SC_OPEN_MAX"))  # `went` too: the program may go on
        while True:
            pid, status = os.wait()
            if pid == program:
                code = os.waitstatus_to_exitcode(status)
                os._exit(128 - code if code < 0 else code)
    os.close(went)
    os.read(go, 1)  # EOF once the init holds no descriptor
    os.close(go)
    signal.signal(signal.SIGINT, signal.default_int_handler)
"""

# Runs inside the sandbox before the program: into the run's memory cgroup first (writing 0
# to cgroup.procs moves the writer; its children are born inside), then limits (so the
# program can never raise them; a negative value leaves that limit alone), then the uid drop
# (root is exempt from RLIMIT_NPROC), then a byte on the ready pipe so the caller can tell
# "the sandbox could not start" from "the program failed". The program then runs in this same
# interpreter (one interpreter start per run, not two), with unbuffered stdout and stderr as
# under `python -u`, and site-packages only when asked for.
_BOOTSTRAP = (
    """\
import os, resource, sys
cpu, mem, nproc, fsize, uid, ready, cgroup, site, init = map(int, sys.argv[1:10])
if cgroup >= 0:
    os.write(cgroup, b"0")
path = sys.argv[10]
keep = 2
"""
    + _INIT_SOURCE
    + CONFINE_SOURCE
    + """\
code = compile(source, path, "exec")
sys.argv = [path]
__file__ = path
# The program runs in __main__'s namespace, as under `python path`, without our names.
for name in [n for n in globals() if not n.startswith("__") and n != "code"]:
    del globals()[name]
del name
exec(globals().pop("code"), globals())
"""
)

# Threaded numeric libraries would otherwise start one thread per core and hit RLIMIT_NPROC.
_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
_ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
)


@dataclass(frozen=True)
class SandboxLimits:
    """Per-program limits; file_size_mb caps each file and all of the private /tmp together."""

    cpu_seconds: float = 5.0
    wall_seconds: float = 10.0
    memory_mb: int = 1024
    max_processes: int = 32
    file_size_mb: int = 16
    max_output_chars: int = 2048

    @classmethod
    def from_config(cls, section: dict) -> SandboxLimits:
        """Limits from the config's `sandbox:` section (other keys there are ignored)."""
        names = {field.name for field in fields(cls)}
        return cls(**{key: value for key, value in section.items() if key in names})


@dataclass(frozen=True)
class SandboxResult:
    """How one program ended. returncode is None when the sandbox killed it or never started."""

    status: str
    stdout: str
    stderr: str
    returncode: int | None
    duration: float

    @property
    def output(self) -> str:
        """What the interpreter shows the model: stdout, then stderr (its tail unless ok)."""
        stderr = self.stderr if self.status == "ok" else _error_tail(self.stderr)
        parts = [text.rstrip("\n") for text in (self.stdout, stderr) if text.strip()]
        note = _STATUS_NOTES.get(self.status)
        if note:
            parts.append(note)
        return "\n".join(parts)


_STATUS_NOTES = {
    "timeout": "[timeout: the program ran past its time limit and was stopped]",
    "memory": "[memory: the program ran out of memory]",
    "output-limit": "[output-limit: the output was too long and was cut; the program was stopped]",
    "refused": "[refused: the sandbox could not run the program]",
    "cancelled": "[cancelled: the batch was cancelled or ran past its deadline]",
}


def _error_tail(stderr: str) -> str:
    """The last traceback cut to the program's own last frame and the exception; else the
    last few lines (a SyntaxError, a message from a killed program)."""
    _, header, traceback = stderr.rpartition(_TRACEBACK_HEADER)
    lines = traceback.strip("\n").splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    if not header or not frames:
        return "\n".join(stderr.strip("\n").splitlines()[-_TAIL_LINES:])
    own_frames = [i for i in frames if _PROGRAM_FILE_MARK in lines[i]] or frames
    own_end = next((i for i in frames if i > own_frames[-1]), len(lines))
    exception = [line for line in lines[frames[-1] + 1 :] if not line.startswith("    ")]
    if own_end == len(lines):  # the program's frame is the last one: keep it all
        exception = []
    return "\n".join([header, *lines[own_frames[-1] : own_end], *exception])


def weaker_guarantees(drops_root: bool) -> list[str]:
    """The GUARANTEES that do not hold for this runner."""
    missing = [] if drops_root else ["own_uid"]
    return missing + ([] if memory_parent() is not None else ["memory_group"])


def _hold_guarantees(missing: list[str], require: Sequence[str]) -> None:
    """Refuse a required guarantee that does not hold; say once what holds instead of the rest."""
    unknown = sorted(set(require) - set(GUARANTEES))
    if unknown:
        raise ReasonRLError(f"sandbox.require: unknown {unknown}; known: {sorted(GUARANTEES)}")
    refused = [name for name in missing if name in require]
    if refused:
        what = "; ".join(f"{name}: {GUARANTEES[name][0]}" for name in refused)
        raise ReasonRLError(f"sandbox.require: does not hold here ({what})")
    said = "; ".join(f"no {name}: {GUARANTEES[name][1]}" for name in missing)
    if said and said not in _said:
        _said.add(said)
        _log.warning("sandbox weaker than as root: %s (sandbox.require refuses to run so)", said)


def find_bwrap() -> str | None:
    """Path of the bubblewrap executable, or None (tests patch this)."""
    return shutil.which("bwrap")


def bwrap_available() -> bool:
    return find_bwrap() is not None


class CancelToken:
    """Cancels the programs of a batch: every supervisor waiting on it wakes and kills its own.

    A pipe whose read end turns readable (and stays so) once cancel() writes to it; select()
    on it costs nothing while nothing is cancelled.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        self._lock = threading.Lock()
        self.cancelled = False

    def fileno(self) -> int:
        return self._read

    def cancel(self) -> None:
        with self._lock:
            if not self.cancelled:
                self.cancelled = True
                os.write(self._write, b"x")

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


class Sandbox:
    """Runs Python programs under bubblewrap (or, if explicitly allowed, under rlimits only)."""

    def __init__(
        self,
        limits: SandboxLimits = SandboxLimits(),  # noqa: B008 (frozen, so sharing is safe)
        allow_unsandboxed: bool = False,
        workers: int = 2,
        pool_memory_mb: int = 0,
        site_packages: bool = False,
        zygote: bool = True,
        require: Sequence[str] = (),
    ) -> None:
        self.limits = limits
        self.workers = max(1, workers)
        self.pool_memory_mb = pool_memory_mb
        # Without site-packages a program sees the standard library only: the same on every
        # host, no host .pth file runs inside, and the interpreter starts several times faster.
        self.site_packages = site_packages
        self.bwrap = find_bwrap()
        if self.bwrap is None:
            if not allow_unsandboxed:
                raise ReasonRLError(BWRAP_MISSING)
            warnings.warn(UNSANDBOXED_WARNING, RuntimeWarning, stacklevel=2)
        self.seccomp = seccomp.filter_bytes() if self.bwrap else None
        self.drops_root = self.bwrap is not None and os.geteuid() == 0
        if self.bwrap is not None:
            _hold_guarantees(weaker_guarantees(self.drops_root), require)
        if self.drops_root:
            os.close(_open_lock_folder())  # a lock folder we cannot trust stops us here
        # In a venv, the base interpreter: the venv (in the project folder) stays outside.
        self.interpreter = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
        # A warm interpreter per pool worker forks each program (see reasonrl.zygote); off,
        # each program starts its own bwrap and interpreter.
        self.zygote = zygote and self.bwrap is not None
        self._zygotes = WarmZygotes()  # shared by the copies with_limits makes

    @classmethod
    def from_config(cls, section: dict) -> Sandbox:
        """A sandbox from the config's `sandbox:` section."""
        return cls(
            SandboxLimits.from_config(section),
            allow_unsandboxed=bool(section.get("allow_unsandboxed", False)),
            workers=int(section.get("workers", 2)),
            pool_memory_mb=int(section.get("pool_memory_mb", 0)),
            site_packages=bool(section.get("site_packages", False)),
            zygote=bool(section.get("zygote", True)),
            require=tuple(section.get("require", ())),
        )

    def with_limits(self, limits: SandboxLimits) -> Sandbox:
        """The same sandbox (backend, workers, pool memory) with other per-program limits."""
        other = copy.copy(self)
        other.limits = limits
        return other

    def warm(self) -> contextlib.AbstractContextManager[None]:
        """Within this block (a pool's batch), runs go through zygotes kept between programs,
        closed and reaped when it ends. Outside it, each run starts a bwrap sandbox and an
        interpreter of its own: for one program that is the quicker start."""
        return self._zygotes.warm()

    def run(
        self,
        code: str,
        stdin: str = "",
        *,
        cancel: CancelToken | None = None,
        deadline: float | None = None,
    ) -> SandboxResult:
        """Run one program; never raises for anything the program does.

        cancel: a token whose cancel() stops the program ("cancelled"); deadline: a
        time.monotonic() instant after which it is stopped ("cancelled"), e.g. its batch's.
        """
        start = time.monotonic()
        if _cancelled_before(start, cancel, deadline):
            return SandboxResult("cancelled", "", "", None, 0.0)
        try:
            if self.zygote and self._zygotes.active:
                return self._run_in_zygote(code, stdin, start, cancel, deadline)
            return self._run(code, stdin, start, cancel, deadline)
        except Exception as exc:  # the caller must survive a sandbox that cannot start
            return _refused(exc, start)

    def _run(
        self, code: str, stdin: str, start: float, cancel: CancelToken | None, deadline
    ) -> SandboxResult:
        _sweep_stale_host_dirs()
        with (
            tempfile.TemporaryDirectory(prefix=f"{HOST_DIR_PREFIX}{os.getpid()}-") as host_tmp,
            ExitStack() as resources,
        ):
            if self.bwrap is not None:
                resources.enter_context(as_subreaper())
            uid = resources.enter_context(_uid_slot()) if self.drops_root else -1
            group = MemoryGroup.create(self.limits.memory_mb * 1024 * 1024)
            if group is not None:
                resources.callback(group.remove)
            fds = _SandboxFds(resources, Path(host_tmp), code, stdin, group, self.seccomp)
            command, pass_fds = self._command(fds, uid)
            process = subprocess.Popen(
                command,
                stdin=fds.stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=pass_fds,
                cwd=host_tmp,
                env={} if self.bwrap else {**_ENV, "HOME": host_tmp, "TMPDIR": host_tmp},
                start_new_session=True,
            )
            fds.close_child_ends()  # so reads see EOF once the sandbox is gone
            supervisor = _Supervisor(
                process, fds.status_read.fileno(), self.limits, bool(self.bwrap), group
            )
            return supervisor.wait(fds.ready_read.fileno(), start, cancel, deadline)

    def session(self, history: Sequence[str] = ()) -> Session:
        """An interpreter session whose cells share one namespace (see Session); history:
        cells run before it (elsewhere), replayed silently before its first cell."""
        return Session(self, history)

    def _run_in_zygote(
        self, code: str, stdin: str, start: float, cancel: CancelToken | None, deadline
    ) -> SandboxResult:
        with ExitStack() as resources:
            program = self._start_in_zygote(resources, code, stdin, channel=None)
            supervisor = _ZygoteSupervisor(
                program.zygote, program.stdout, program.stderr, self.limits, program.group
            )
            return supervisor.wait(program.ready.fileno(), start, cancel, deadline)

    def _start_in_zygote(
        self, resources: ExitStack, code: str, stdin: str, channel: socket.socket | None
    ) -> _ZygoteProgram:
        """Start a program in a leased zygote; what it holds is released by `resources`.
        channel: the program's end of a session's channel (the program is then a session
        whose first cell is `code`), or None."""
        limits = self.limits
        # key: what the zygote's bwrap options depend on (the size of its /tmp)
        lease = self._zygotes.lease(limits.file_size_mb, self._start_zygote)
        zygote = resources.enter_context(lease)
        uid = resources.enter_context(_uid_slot()) if self.drops_root else -1
        group = MemoryGroup.create(limits.memory_mb * 1024 * 1024)
        if group is not None:
            resources.callback(group.remove)
        stdout_read, stdout_write = (resources.enter_context(end) for end in _pipe())
        stderr_read, stderr_write = (resources.enter_context(end) for end in _pipe())
        ready_read, ready_write = (resources.enter_context(end) for end in _pipe())
        child_ends = [
            resources.enter_context(_memfd("stdin", stdin.encode("utf-8", "replace"))),
            stdout_write,
            stderr_write,
            ready_write,
        ]
        if group is not None:
            child_ends.append(resources.enter_context(os.fdopen(group.open_procs(), "wb", 0)))
        if channel is not None:
            child_ends.append(resources.enter_context(channel))
        numbers = self._limit_numbers(uid)
        numbers += [int(self.site_packages), int(group is not None), int(channel is not None)]
        source = code.encode("utf-8", "replace")
        zygote.start_program(source, numbers, [end.fileno() for end in child_ends])
        for end in child_ends:
            end.close()  # so reads see EOF once the program's processes are gone
        return _ZygoteProgram(zygote, stdout_read, stderr_read, ready_read, group)

    def _start_zygote(self) -> Zygote:
        """A zygote in a fresh bwrap sandbox with this sandbox's options (its /tmp size)."""
        _sweep_stale_host_dirs()
        ctrl, child_ctrl = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        status_read, status_write = os.pipe()
        child_fds = [child_ctrl.detach(), status_write]
        host_dir = tempfile.TemporaryDirectory(prefix=f"{HOST_DIR_PREFIX}{os.getpid()}-")
        script = Path(host_dir.name) / SCRIPT_NAME
        script.touch(0o644)  # rewritten per program (Zygote.write_script)
        options = _bwrap_options(self.limits, self.interpreter, None, status_write)
        options += ["--ro-bind", str(script), SANDBOX_SCRIPT]
        # Not --die-with-parent: that follows the thread that started bwrap, and a zygote
        # outlives the pool worker that started it. The zygote exits (killing its program)
        # when its socket closes, as it does when this process dies.
        options.remove("--die-with-parent")
        options.append("--as-pid-1")  # the zygote is the namespace's init (see reasonrl.zygote)
        if self.seccomp is not None:
            with _memfd("seccomp.bpf", self.seccomp) as seccomp_file:
                child_fds.append(os.dup(seccomp_file.fileno()))
            options += ["--seccomp", str(child_fds[-1])]
        interpreter = [self.interpreter, "-I", "-S", "-c", ZYGOTE_SOURCE, str(child_fds[0])]
        interpreter.append(",".join(PRELOADED_MODULES))
        command = [self.bwrap, *options, "--", *interpreter]
        return Zygote(command, child_fds, ctrl, status_read, host_dir)

    def _limit_numbers(self, uid: int) -> list[int]:
        """CPU seconds, address space, processes, file size and uid, as the bootstrap and the
        zygote take them (a negative value leaves that limit alone)."""
        limits = self.limits
        # Unsandboxed, RLIMIT_NPROC would count every process of the user (or none, for root),
        # so it is left alone there; in bwrap it counts the sandbox's own processes.
        max_processes = limits.max_processes if self.bwrap is not None else -1
        if self.bwrap is not None and not self.drops_root:
            # Without root RLIMIT_NPROC counts the uid's processes in the sandbox's own user
            # namespace: the program's and its init's (the zygote or _INIT_SOURCE's).
            max_processes += 1
        return [
            _whole_cpu_seconds(limits),
            limits.memory_mb * 1024 * 1024,
            max_processes,
            limits.file_size_mb * 1024 * 1024,
            uid,
        ]

    def _command(self, fds: _SandboxFds, uid: int) -> tuple[list[str], tuple]:
        """The argv that runs the bootstrap (in bwrap when we have it) and the fds it needs."""
        limits = self.limits
        cgroup_fd = fds.cgroup.fileno() if fds.cgroup is not None else -1
        bootstrap = [
            self.interpreter,
            "-I",
            "-S",
            "-c",
            _BOOTSTRAP,
            *(str(number) for number in self._limit_numbers(uid)),
            str(fds.ready_write.fileno()),
            str(cgroup_fd),
            str(int(self.site_packages)),
            str(int(self.bwrap is not None)),
        ]
        shared = [fds.ready_write.fileno()] + ([cgroup_fd] if cgroup_fd >= 0 else [])
        if self.bwrap is None:
            return [*bootstrap, "main.py"], tuple(shared)
        options = _bwrap_options(
            limits, self.interpreter, fds.script.fileno(), fds.status_write.fileno()
        )
        options.append("--as-pid-1")  # the bootstrap is the namespace's init (_INIT_SOURCE)
        bwrap_fds = [fds.script.fileno(), fds.status_write.fileno()]
        if fds.seccomp is not None:
            options += ["--seccomp", str(fds.seccomp.fileno())]
            bwrap_fds.append(fds.seccomp.fileno())
        return [self.bwrap, *options, "--", *bootstrap, SANDBOX_SCRIPT], tuple(shared + bwrap_fds)


class _SandboxFds:
    """The files and pipes one run hands to bwrap and the bootstrap (closed by `resources`)."""

    def __init__(
        self,
        resources: ExitStack,
        host_tmp: Path,
        code: str,
        stdin: str,
        group: MemoryGroup | None,
        seccomp_filter: bytes | None,
    ) -> None:
        self.script = resources.enter_context(_file_with(host_tmp / "main.py", code))
        self.stdin = resources.enter_context(_file_with(host_tmp / "stdin", stdin))
        self.ready_read, self.ready_write = (resources.enter_context(end) for end in _pipe())
        self.status_read, self.status_write = (resources.enter_context(end) for end in _pipe())
        self.cgroup = None
        if group is not None:
            self.cgroup = resources.enter_context(os.fdopen(group.open_procs(), "wb", 0))
        self.seccomp = None
        if seccomp_filter is not None:
            path = host_tmp / "seccomp.bpf"
            path.write_bytes(seccomp_filter)
            self.seccomp = resources.enter_context(open(path, "rb"))  # noqa: SIM115

    def close_child_ends(self) -> None:
        self.ready_write.close()
        self.status_write.close()
        if self.cgroup is not None:
            self.cgroup.close()


def _sweep_stale_host_dirs() -> None:
    """Remove the host folders of runs whose caller was killed before it could."""
    with contextlib.suppress(OSError):
        for path in Path(tempfile.gettempdir()).glob(f"{HOST_DIR_PREFIX}*"):
            if owner_is_gone(path.name, HOST_DIR_PREFIX):
                shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _uid_slot() -> Iterator[int]:
    """A sandbox uid that no other running sandbox on this host holds (a flock per uid)."""
    folder = _open_lock_folder()
    try:
        for uid in SANDBOX_UIDS:
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(f"{uid}.lock", flags, 0o600, dir_fd=folder)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield uid
            finally:
                os.close(fd)  # releases the lock
            return
    finally:
        os.close(folder)
    raise ReasonRLError(f"all {len(SANDBOX_UIDS)} sandbox uids are in use on this host")


def _open_lock_folder() -> int:
    """UID_LOCK_DIR, opened as a folder of ours: made with mode 0700 when missing; refused when
    it is a symbolic link, not a folder, someone else's or open to others (in a shared /tmp,
    another user could have made it to have us create files through it)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(UID_LOCK_DIR, 0o700)
    refusal = f"sandbox uid lock folder {UID_LOCK_DIR}"
    try:
        fd = os.open(UID_LOCK_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:  # ELOOP for a symbolic link, ENOTDIR for a file
        raise ReasonRLError(
            f"{refusal} is a symbolic link or not a folder ({exc.strerror}): refusing to use "
            "it; remove it"
        ) from None
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
        os.close(fd)
        raise ReasonRLError(
            f"{refusal} belongs to uid {info.st_uid} with mode "
            f"{stat.S_IMODE(info.st_mode):04o}, not to this runner (uid {os.geteuid()}) with "
            "mode 0700: refusing to use it; remove it"
        )
    return fd


def _bwrap_options(
    limits: SandboxLimits, interpreter: str, script_fd: int | None, status_fd: int
) -> list[str]:
    """bwrap flags: fresh namespaces, read-only system and interpreter, private /tmp (with the
    program at SANDBOX_SCRIPT, unless script_fd is None: a zygote writes each one there)."""
    # As root we keep the host user namespace so the bootstrap can drop to a real uid that
    # RLIMIT_NPROC applies to; as a normal user bwrap needs a user namespace.
    namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
    namespaces += ["--unshare-cgroup-try"] + ([] if os.geteuid() == 0 else ["--unshare-user"])
    options = [*namespaces, "--die-with-parent", "--new-session", "--clearenv"]
    for name, value in _ENV.items():
        options += ["--setenv", name, value]
    options += ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        options += _mirror_top_level(Path("/") / top)
    for etc_file in _ETC_FILES:
        options += ["--ro-bind-try", etc_file, etc_file]
    options += ["--proc", "/proc", "--dev", "/dev"]
    tmp_bytes = str(limits.file_size_mb * 1024 * 1024)
    options += ["--perms", "1777", "--size", tmp_bytes, "--tmpfs", "/tmp"]
    # multiprocessing's locks live in /dev/shm: a private, capped one, like /tmp
    options += ["--perms", "1777", "--size", tmp_bytes, "--tmpfs", "/dev/shm"]
    if script_fd is not None:
        options += ["--perms", "0444", "--ro-bind-data", str(script_fd), SANDBOX_SCRIPT]
    for prefix in _interpreter_prefixes(interpreter):
        options += _bind_with_parents(prefix)
    # The sandbox's own root and /etc are bwrap's tmpfs, which without root belongs to the
    # program's uid: read-only, as they are to a program of a uid of its own.
    options += ["--remount-ro", "/"]
    options += ["--chdir", "/tmp", "--json-status-fd", str(status_fd)]
    return options


def _mirror_top_level(path: Path) -> list[str]:
    """/bin, /lib, ...: the same symlink into /usr, or a read-only bind of the real folder."""
    if path.is_symlink():
        return ["--symlink", os.readlink(path), str(path)]
    return ["--ro-bind", str(path), str(path)] if path.is_dir() else []


def _interpreter_prefixes(interpreter: str) -> list[str]:
    """Real folders holding the interpreter and its standard library, outside /usr."""
    candidates = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
    candidates.add(str(Path(interpreter).parent.parent))
    return [p for p in sorted(candidates) if p != "/" and not f"{p}/".startswith("/usr/")]


def _bind_with_parents(prefix: str) -> list[str]:
    """Read-only bind of prefix; its parents are created world-traversable (/root is 0700)."""
    options = []
    for parent in reversed(Path(prefix).parents[:-1]):
        options += ["--perms", "0755", "--dir", str(parent)]
    return options + ["--ro-bind", prefix, prefix]


class _Supervisor:
    """Reads a running sandbox's output, enforces wall clock and output cap, and classifies."""

    def __init__(
        self,
        process: subprocess.Popen,
        status_fd: int,
        limits: SandboxLimits,
        sandboxed: bool,
        group: MemoryGroup | None,
    ) -> None:
        self.process = process
        self.pidfd = os.pidfd_open(process.pid)  # readable once our child (bwrap) exits
        self.status_fd = status_fd
        self.limits = limits
        self.sandboxed = sandboxed
        self.group = group
        self.status_text = b""
        self.sandbox_pid: int | None = None  # host pid of pid 1 of the sandbox's pid namespace
        self.sandbox_pidfd: int | None = None  # that process, to reap once bwrap is gone
        self.decoders = {
            name: codecs.getincrementaldecoder("utf-8")(errors="replace")
            for name in ("stdout", "stderr")
        }
        self.text = {"stdout": "", "stderr": ""}
        self.chars_seen = {"stdout": 0, "stderr": 0}

    def wait(
        self,
        ready_fd: int,
        start: float,
        cancel: CancelToken | None = None,
        deadline: float | None = None,
    ) -> SandboxResult:
        wall_deadline = start + self.limits.wall_seconds
        stop_at = wall_deadline if deadline is None else min(wall_deadline, deadline)
        try:
            stopped_for = self._pump(stop_at, cancel)
            if stopped_for == "timeout" and stop_at < wall_deadline:
                stopped_for = "cancelled"  # the batch's deadline came before the program's own
        finally:
            if not self._ended():
                self._kill()
        exitcode = self._reap()
        duration = time.monotonic() - start
        ready = self._was_ready(ready_fd)
        status, returncode = self._classify(stopped_for, exitcode, ready, duration)
        return SandboxResult(status, self.text["stdout"], self.text["stderr"], returncode, duration)

    def _was_ready(self, ready_fd: int) -> bool:
        """Whether the sandbox got as far as the program (its bootstrap wrote the ready byte)."""
        return _read_nonblocking(ready_fd) == b"1"

    def _ended(self) -> bool:
        """Whether the sandbox is gone by itself (without bwrap, background processes may
        outlive the program: its group is killed whatever happened)."""
        return self.sandboxed and _wait_readable(self.pidfd, 0)

    def _sources(self) -> list[tuple[object, str]]:
        """What _pump reads: the program's output, bwrap's status, and bwrap's exit."""
        return [
            (self.process.stdout, "stdout"),
            (self.process.stderr, "stderr"),
            (self.status_fd, "status"),
            (self.pidfd, "exit"),
        ]

    def _on_exit(self) -> None:
        """bwrap has exited: its pidfd turned readable."""

    def _on_done(self) -> bool | None:
        """A session's channel turned readable (only _SessionSupervisor has one): whether
        its cell has ended; None once the channel is closed."""
        raise NotImplementedError

    def _drain(self) -> str | None:
        """Once a session's cell has ended: the rest of its output (_SessionSupervisor)."""
        raise NotImplementedError

    def _pump(self, deadline: float, cancel: CancelToken | None) -> str | None:
        """Read until the program exits and its pipes close; why it was cut, if it was."""
        with selectors.DefaultSelector() as selector:
            for source, name in self._sources():
                selector.register(source, selectors.EVENT_READ, name)
            if cancel is not None:
                selector.register(cancel.fileno(), selectors.EVENT_READ, "cancel")
            while len(selector.get_map()) > (cancel is not None):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return "timeout"
                for key, _ in selector.select(remaining):
                    if key.data == "cancel":
                        return "cancelled"
                    if key.data == "exit":
                        selector.unregister(key.fileobj)
                        self._on_exit()
                        continue
                    if key.data == "done":  # a session's channel: its cell may have ended
                        done = self._on_done()
                        if done is None:
                            selector.unregister(key.fileobj)
                        elif done:  # the process lives on
                            return self._drain()
                        continue
                    data = os.read(key.fd, _READ_CHUNK)
                    if not data:
                        selector.unregister(key.fileobj)
                    elif key.data == "status":
                        self._note_status(data)
                    elif self._append(key.data, data):
                        return "output-limit"
        return None

    def _append(self, stream: str, data: bytes) -> bool:
        """Add output; True once it is over the cap and the program must be stopped.

        stdout keeps its head and stops at the cap. stderr keeps its tail, where a traceback
        says what went wrong, and only a flood (many times the cap) stops the program.
        """
        cap = self.limits.max_output_chars
        new_text = self.decoders[stream].decode(data)
        self.chars_seen[stream] += len(new_text)
        if stream == "stdout":
            self.text[stream] = (self.text[stream] + new_text)[:cap]
            return self.chars_seen[stream] > cap
        self.text[stream] = (self.text[stream] + new_text)[-cap:]
        return self.chars_seen[stream] > cap * _STDERR_FLOOD_FACTOR

    def _note_status(self, data: bytes) -> None:
        """bwrap's JSON status lines; the first names the host pid of the sandbox's pid 1."""
        self.status_text += data
        if self.sandbox_pid is None and b"\n" in self.status_text:
            first = self.status_text.split(b"\n", 1)[0]
            self.sandbox_pid = json.loads(first).get("child-pid")
            if self.sandbox_pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    self.sandbox_pidfd = os.pidfd_open(self.sandbox_pid)

    def _kill(self) -> None:
        """Kill everything the program started, and return only once it is gone.

        Killing the sandbox's pid 1 makes the kernel kill every process in its namespace
        before bwrap (our child) can reap it and exit, so nothing outlives the run.
        """
        if self.sandboxed and self.sandbox_pid is not None:
            _signal(lambda: os.kill(self.sandbox_pid, signal.SIGKILL))
            if _wait_readable(self.pidfd, _KILL_GRACE_SECONDS):
                return
        _signal(lambda: os.killpg(self.process.pid, signal.SIGKILL))

    def _reap(self) -> int:
        """Wait for our child (it is dead or killed by now), reap the sandbox's pid 1 that it
        left behind, and release their pipes and pidfds."""
        try:
            return self.process.wait()
        finally:
            os.close(self.pidfd)
            self.process.stdout.close()
            self.process.stderr.close()
            if self.sandbox_pidfd is not None:
                self._reap_sandbox_init()

    def _reap_sandbox_init(self) -> None:
        """bwrap exits before its init (the sandbox's pid 1) does; the init, dead or about to
        die (its namespace's processes are gone), is ours now (we are a subreaper)."""
        try:
            _wait_readable(self.sandbox_pidfd, _KILL_GRACE_SECONDS)
            with contextlib.suppress(ChildProcessError):  # bwrap reaped it itself
                os.waitid(os.P_PIDFD, self.sandbox_pidfd, os.WEXITED | os.WNOHANG)
        finally:
            os.close(self.sandbox_pidfd)

    def _classify(self, stopped_for: str | None, exitcode: int, ready: bool, duration: float):
        """(status, returncode) from why we stopped it, or else from how the program ended."""
        if stopped_for is not None:
            return stopped_for, None
        if not ready:
            return "refused", None
        returncode = self._program_returncode(exitcode)
        if returncode == 0:
            return "ok", returncode
        if self.group is not None and self.group.oom_killed():
            return "memory", returncode
        if self._hit_cpu_limit(returncode, duration):
            return "timeout", returncode
        last_line = (self.text["stderr"].strip().splitlines() or [""])[-1]
        if any(marker in last_line for marker in _MEMORY_MARKERS):
            return "memory", returncode
        return "error", returncode

    def _hit_cpu_limit(self, returncode: int, duration: float) -> bool:
        """SIGXCPU comes from RLIMIT_CPU; SIGKILL does too for a program that ignores SIGXCPU,
        which can only have happened after the hard limit (soft + 1 s) of CPU time."""
        if returncode == -signal.SIGXCPU:
            return True
        cpu_hard_limit = math.ceil(self.limits.cpu_seconds) + 1
        return (
            returncode == -signal.SIGKILL
            and duration >= cpu_hard_limit - _CPU_ACCOUNTING_SLACK_SECONDS
        )

    def _program_returncode(self, exitcode: int) -> int:
        """The program's exit code, negative for a signal (bwrap reports signals as 128+n)."""
        if self.sandboxed and exitcode > 128:
            return -(exitcode - 128)
        return exitcode


class _ZygoteSupervisor(_Supervisor):
    """The same for a program a zygote runs: its exit comes as a message on the zygote's
    socket (once every process of it is gone), and the zygote kills it when asked."""

    def __init__(
        self,
        zygote: Zygote,
        stdout: BinaryIO,
        stderr: BinaryIO,
        limits: SandboxLimits,
        group: MemoryGroup | None,
    ) -> None:
        self.zygote = zygote
        self.stdout, self.stderr = stdout, stderr
        self.limits = limits
        self.sandboxed = True
        self.group = group
        self.wait_status: int | None = None
        self.decoders = {
            name: codecs.getincrementaldecoder("utf-8")(errors="replace")
            for name in ("stdout", "stderr")
        }
        self.text = {"stdout": "", "stderr": ""}
        self.chars_seen = {"stdout": 0, "stderr": 0}

    def _ended(self) -> bool:
        return self.wait_status is not None

    def _sources(self) -> list[tuple[object, str]]:
        return [(self.stdout, "stdout"), (self.stderr, "stderr"), (self.zygote.ctrl, "exit")]

    def _on_exit(self) -> None:
        self.wait_status = self.zygote.exit_status(0)

    def _kill(self) -> None:
        self.zygote.kill_program()
        self.wait_status = self.zygote.exit_status(_ZYGOTE_KILL_GRACE_SECONDS)

    def _reap(self) -> int:
        try:
            if self.wait_status is None:
                self.wait_status = self.zygote.exit_status(_ZYGOTE_KILL_GRACE_SECONDS)
            return self.wait_status
        finally:
            self.stdout.close()
            self.stderr.close()

    def _program_returncode(self, exitcode: int) -> int:
        return os.waitstatus_to_exitcode(exitcode)


@dataclass(frozen=True)
class _ZygoteProgram:
    """A program a zygote has started: the zygote, our ends of its pipes, its memory group."""

    zygote: Zygote
    stdout: BinaryIO
    stderr: BinaryIO
    ready: BinaryIO
    group: MemoryGroup | None


def program_with_history(previous: Sequence[str], cell: str) -> str:
    """Earlier cells re-run silently (errors swallowed, as a notebook keeps state), then `cell`.

    The tool loop's program for a cell since before sessions, kept byte for byte: a cell's
    output (its traceback's line numbers too) is what the policies were trained on, and a
    session's cell must print the same (see Session)."""
    lines = ["import contextlib as _c, io as _io"]
    for old in previous:
        lines += [
            "with _c.redirect_stdout(_io.StringIO()), _c.redirect_stderr(_io.StringIO()):",
            "    try:",
            f"        exec(compile({old!r}, '<cell>', 'exec'))",
            "    except BaseException:",
            "        pass",
        ]
    lines.append("del _c, _io")
    return "\n".join(lines) + "\n" + cell


class Session:
    """An interpreter session (a notebook): cells run one after another in one process, in
    one namespace, so each sees what the earlier ones left, and each cell runs once.

    A cell's result is the one the tool loop's re-run program, program_with_history(the
    cells before, the cell), gives: the session's process runs that very program (from
    /tmp/main.py, so tracebacks show its line numbers and lines) less the re-run of the
    cells it has run already, and after each cell makes what the cell defined look as its
    re-run would (see reasonrl.zygote's make_runner). Its limits are that program's too:
    RLIMIT_CPU and the memory cap hold for the process's whole life (the re-run's CPU time
    and memory are the earlier cells'), and a cell's wall clock is what the earlier cells of
    the process left of wall_seconds. What a re-run would not repeat exactly (the clock, pids,
    unseeded random numbers, object addresses) can differ, as it differs between two
    re-runs, and so can the frames below the cell (the session's runner is not
    run_program) and their count where the pool would run the re-run program in a fresh
    sandbox (a batch no larger than its workers) rather than a zygote.

    The process is a session-mode program of a zygote leased for the session's life (the
    pool's zygotes while sandbox.warm() is open; see reasonrl.zygote): seccomp-filtered,
    rlimited, its own uid and memory cgroup, as any program there. When a cell ends, the
    zygote kills every process it started (only the session's own runs on between cells).

    A cell stopped for a limit, one that ends the process, or one after which the process
    could not go on as the re-run would (see make_runner), ends the session's process: the
    next cell starts a new one that runs the whole re-run program, as the first cell of a
    session with a history (cells run before it, elsewhere) does. close() kills the process
    and everything of its uid; the zygote then cleans up as after any program. Without
    zygotes (sandbox.zygote off, or no bwrap), each cell is the re-run program.
    """

    def __init__(self, sandbox: Sandbox, history: Sequence[str] = ()) -> None:
        self.sandbox = sandbox
        self.history = list(history)
        self._live: _LiveSession | None = None

    def run(
        self, code: str, *, cancel: CancelToken | None = None, deadline: float | None = None
    ) -> SandboxResult:
        """Run the next cell; never raises for anything the cell does (as Sandbox.run)."""
        start = time.monotonic()
        program = program_with_history(self.history, code)
        try:
            if not self.sandbox.zygote:
                return self.sandbox.run(program, cancel=cancel, deadline=deadline)
            if _cancelled_before(start, cancel, deadline):
                return SandboxResult("cancelled", "", "", None, 0.0)
            return self._run_cell(program, start, cancel, deadline)
        except Exception as exc:  # as Sandbox.run: the caller survives, the session ends
            self.close()
            return _refused(exc, start)
        finally:
            self.history.append(code)

    def close(self) -> None:
        """Kill the session's process (if any) and release what it holds; idempotent."""
        live, self._live = self._live, None
        if live is not None:
            live.close()

    def _run_cell(
        self, program: str, start: float, cancel: CancelToken | None, deadline: float | None
    ) -> SandboxResult:
        limits = self.sandbox.limits
        live = self._live
        if live is not None and live.elapsed >= limits.wall_seconds:
            self.close()  # the re-run alone would take its whole wall clock: it runs, as there
        elif live is not None and not live.send_cell(program, len(self.history)):
            self.close()  # its process ended between cells: a new one re-runs the history
        if self._live is None:
            self._live = _LiveSession(self.sandbox, program, len(self.history))
        live = self._live
        began = time.monotonic()  # (a new process's zygote start is no cell's time)
        cell_limits = replace(limits, wall_seconds=limits.wall_seconds - live.elapsed)
        supervisor = _SessionSupervisor(live, cell_limits)
        result = supervisor.wait(live.program.ready.fileno(), start, cancel, deadline)
        live.elapsed += time.monotonic() - began
        if supervisor.wait_status is not None:  # the process has ended (or was killed)
            live.ended = True
            self.close()
        return result


class _LiveSession:
    """A session's process in its zygote, with what it holds (released by close()).
    elapsed: the wall-clock seconds its cells have run so far (a re-run program's would be
    theirs too)."""

    def __init__(self, sandbox: Sandbox, first_program: str, history: int) -> None:
        self._resources = ExitStack()
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.channel = self._resources.enter_context(ours)
            self.token = _cell_token()
            # the first cell's, with the program: it re-runs the `history` cells before it
            self.channel.send(self.token + b" %d 0" % history)
            self.program = sandbox._start_in_zygote(self._resources, first_program, "", theirs)
        except BaseException:
            self._resources.close()
            raise
        self.ended = False  # the process has ended and the zygote has said so
        self.elapsed = 0.0
        self._ready = False

    def ready(self) -> bool:
        """Whether the process got as far as the program (its ready byte, read once)."""
        self._ready = self._ready or _read_nonblocking(self.program.ready.fileno()) == b"1"
        return self._ready

    def send_cell(self, program: str, history: int) -> bool:
        """Start the next cell, the re-run program of its `history` earlier cells (which
        this process has run) and it; False if the process has ended."""
        zygote = self.program.zygote
        self._skip_stale_output()
        zygote.write_script(program.encode("utf-8", "replace"))
        self.token = _cell_token()
        try:
            self.channel.send(self.token + b" %d 1" % history)
        except OSError:  # it ended: the zygote says so next
            zygote.exit_status(_ZYGOTE_KILL_GRACE_SECONDS)
            self.ended = True
            return False
        return True

    def _skip_stale_output(self) -> None:
        """What the session's threads or processes wrote between cells, to its pipes or to
        its channel, is no cell's output and no cell's end."""
        for source in (self.program.stdout, self.program.stderr, self.channel):
            for _ in range(_STALE_READS):
                if not _wait_readable(source.fileno(), 0):
                    break
                if not os.read(source.fileno(), _READ_CHUNK):
                    break

    def close(self) -> None:
        zygote = self.program.zygote
        try:
            if not self.ended and not zygote.broken:
                zygote.kill_program()
                zygote.exit_status(_ZYGOTE_KILL_GRACE_SECONDS)
        except ZygoteBroken:
            pass  # its whole sandbox was killed, and its lease closes it
        finally:
            self._resources.close()


class _SessionSupervisor(_ZygoteSupervisor):
    """One cell of a session: it ends when the process says so on the session's channel
    (the process and its pipes live on), or as a program does when the process ends."""

    def __init__(self, live: _LiveSession, limits: SandboxLimits) -> None:
        program = live.program
        super().__init__(program.zygote, program.stdout, program.stderr, limits, program.group)
        self.live = live
        self.cell_status: int | None = None

    def _was_ready(self, ready_fd: int) -> bool:
        return self.live.ready()

    def _hit_cpu_limit(self, returncode: int, duration: float) -> bool:
        """As for the re-run program, whose run would have had the earlier cells' time too."""
        return super()._hit_cpu_limit(returncode, duration + self.live.elapsed)

    def _ended(self) -> bool:
        return self.cell_status is not None or self.wait_status is not None

    def _sources(self) -> list[tuple[object, str]]:
        return [*super()._sources(), (self.live.channel, "done")]

    def _on_done(self) -> bool | None:
        try:
            message = self.live.channel.recv(64)
        except OSError:
            message = b""
        if not message:
            return None  # the process is ending: the zygote reports how
        # The program can write here too: only a message with this cell's token ends it.
        token, _, status = message.partition(b" ")
        if token != self.live.token:
            return False
        valid = status.isdigit() and int(status) < 256
        self.cell_status = int(status) if valid else 1
        self.wait_status = self.zygote.end_cell()  # None: the session's process lives on
        return True

    def _drain(self) -> str | None:
        """The cell's output still in the pipes (it wrote all of it before it said it had
        ended); "output-limit" if that is over the cap, and then the session's process is
        killed, as for output over the cap before the end: no cell ended, as far as wait()
        can tell."""
        for stream, source in (("stdout", self.stdout), ("stderr", self.stderr)):
            while _wait_readable(source.fileno(), 0):
                data = os.read(source.fileno(), _READ_CHUNK)
                if not data:
                    break
                if self._append(stream, data):
                    self.cell_status = None
                    return "output-limit"
        return None

    def _reap(self) -> int:
        """The cell's exit status as a wait status; once the process has ended, its own.
        (The pipes are the session's: they stay open.)"""
        if self.wait_status is None and self.cell_status is not None:
            return self.cell_status << 8
        if self.wait_status is None:
            self.wait_status = self.zygote.exit_status(_ZYGOTE_KILL_GRACE_SECONDS)
        return self.wait_status


def _cell_token() -> bytes:
    """What a session's process must send back, before the exit status, to end a cell: a
    stray or stale message on the channel cannot guess it."""
    return secrets.token_hex(8).encode()


def _whole_cpu_seconds(limits: SandboxLimits) -> int:
    """RLIMIT_CPU counts whole seconds."""
    return max(1, math.ceil(limits.cpu_seconds))


def _cancelled_before(start: float, cancel: CancelToken | None, deadline: float | None) -> bool:
    cancelled = cancel is not None and cancel.cancelled
    return cancelled or (deadline is not None and deadline <= start)


def _refused(exc: Exception, start: float) -> SandboxResult:
    """The result of a run whose sandbox failed (never of anything the program did)."""
    message = f"sandbox failed: {type(exc).__name__}: {exc}"
    return SandboxResult("refused", "", message, None, time.monotonic() - start)


def _file_with(path: Path, text: str) -> BinaryIO:
    path.write_text(text, encoding="utf-8", errors="replace")
    return open(path, "rb")  # noqa: SIM115 (the caller's ExitStack closes it)


def _memfd(name: str, data: bytes) -> BinaryIO:
    """An anonymous in-memory file holding data, read from its start."""
    memfd = os.fdopen(os.memfd_create(name, os.MFD_CLOEXEC), "w+b", buffering=0)
    memfd.write(data)
    memfd.seek(0)
    return memfd


def _pipe() -> tuple[BinaryIO, BinaryIO]:
    """A pipe as unbuffered file objects, so closing one end twice is harmless."""
    read_fd, write_fd = os.pipe()
    return os.fdopen(read_fd, "rb", buffering=0), os.fdopen(write_fd, "wb", buffering=0)


def _signal(send) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        send()


def _wait_readable(fd: int, seconds: float) -> bool:
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        return bool(selector.select(seconds))


def _read_nonblocking(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 1)
    except BlockingIOError:
        return b""

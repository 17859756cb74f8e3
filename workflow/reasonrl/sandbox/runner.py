"""Sandbox: runs one program in a fresh bubblewrap sandbox, or forked by a warm zygote inside a
pool's batch, and never raises for anything the program does.
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, fields
from pathlib import Path

from reasonrl.errors import ReasonRLError
from reasonrl.sandbox import bwrap, seccomp
from reasonrl.sandbox.bwrap import (
    BOOTSTRAP,
    BWRAP_MISSING,
    HOST_DIR_PREFIX,
    SANDBOX_ENV,
    SANDBOX_SCRIPT,
    UNSANDBOXED_WARNING,
    bwrap_options,
    sweep_stale_host_dirs,
)
from reasonrl.sandbox.cgroups import MemoryGroup
from reasonrl.sandbox.guarantees import (
    hold_guarantees,
    open_lock_folder,
    uid_slot,
    weaker_guarantees,
)
from reasonrl.sandbox.results import (
    CancelToken,
    SandboxLimits,
    SandboxResult,
    cancelled_before,
    refused,
    whole_cpu_seconds,
)
from reasonrl.sandbox.sessions import Session
from reasonrl.sandbox.subreaper import as_subreaper
from reasonrl.sandbox.supervisor import (
    Supervisor,
    ZygoteProgram,
    ZygoteSupervisor,
    file_with,
    memfd,
    pipe,
)
from reasonrl.sandbox.zygote import (
    PRELOADED_MODULES,
    SCRIPT_NAME,
    ZYGOTE_SOURCE,
    WarmZygotes,
    Zygote,
)


@dataclass(frozen=True)
class SandboxSettings:
    """The config's sandbox section, typed once at a stage (picklable: a generator process
    makes its own Sandbox from it)."""

    limits: SandboxLimits = SandboxLimits()  # noqa: RUF009 (frozen, so sharing is safe)
    allow_unsandboxed: bool = False
    workers: int = 2
    pool_memory_mb: int = 0
    site_packages: bool = False
    zygote: bool = True
    require: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, section: dict) -> SandboxSettings:
        return cls(
            SandboxLimits.from_config(section),
            allow_unsandboxed=bool(section.get("allow_unsandboxed", False)),
            workers=int(section.get("workers", 2)),
            pool_memory_mb=int(section.get("pool_memory_mb", 0)),
            site_packages=bool(section.get("site_packages", False)),
            zygote=bool(section.get("zygote", True)),
            require=tuple(section.get("require", ())),
        )


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
        self.bwrap = bwrap.find_bwrap()  # (tests patch it there)
        if self.bwrap is None:
            if not allow_unsandboxed:
                raise ReasonRLError(BWRAP_MISSING)
            warnings.warn(UNSANDBOXED_WARNING, RuntimeWarning, stacklevel=2)
        self.seccomp = seccomp.filter_bytes() if self.bwrap else None
        self.drops_root = self.bwrap is not None and os.geteuid() == 0
        if self.bwrap is not None:
            hold_guarantees(weaker_guarantees(self.drops_root), require)
        if self.drops_root:
            os.close(open_lock_folder())  # a lock folder we cannot trust stops us here
        # In a venv, the base interpreter: the venv (in the project folder) stays outside.
        self.interpreter = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
        # A warm interpreter per pool worker forks each program (see reasonrl.sandbox.zygote); off,
        # each program starts its own bwrap and interpreter.
        self.zygote = zygote and self.bwrap is not None
        self._zygotes = WarmZygotes()  # shared by the copies with_limits makes

    @classmethod
    def from_config(cls, section: dict) -> Sandbox:
        """A sandbox from the config's `sandbox:` section."""
        return cls.from_settings(SandboxSettings.from_config(section))

    @classmethod
    def from_settings(cls, settings: SandboxSettings) -> Sandbox:
        """A sandbox from its typed settings (each field is the keyword of its own name)."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(settings)})

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
        if cancelled_before(start, cancel, deadline):
            return SandboxResult("cancelled", "", "", None, 0.0)
        try:
            if self.zygote and self._zygotes.active:
                return self._run_in_zygote(code, stdin, start, cancel, deadline)
            return self._run(code, stdin, start, cancel, deadline)
        except Exception as exc:  # the caller must survive a sandbox that cannot start
            return refused(exc, start)

    def _run(
        self, code: str, stdin: str, start: float, cancel: CancelToken | None, deadline
    ) -> SandboxResult:
        sweep_stale_host_dirs()
        with (
            tempfile.TemporaryDirectory(prefix=f"{HOST_DIR_PREFIX}{os.getpid()}-") as host_tmp,
            ExitStack() as resources,
        ):
            if self.bwrap is not None:
                resources.enter_context(as_subreaper())
            uid = resources.enter_context(uid_slot()) if self.drops_root else -1
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
                env={} if self.bwrap else {**SANDBOX_ENV, "HOME": host_tmp, "TMPDIR": host_tmp},
                start_new_session=True,
            )
            fds.close_child_ends()  # so reads see EOF once the sandbox is gone
            supervisor = Supervisor(
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
            supervisor = ZygoteSupervisor(
                program.zygote, program.stdout, program.stderr, self.limits, program.group
            )
            return supervisor.wait(program.ready.fileno(), start, cancel, deadline)

    def _start_in_zygote(
        self, resources: ExitStack, code: str, stdin: str, channel: socket.socket | None
    ) -> ZygoteProgram:
        """Start a program in a leased zygote; what it holds is released by `resources`.
        channel: the program's end of a session's channel (the program is then a session
        whose first cell is `code`), or None."""
        limits = self.limits
        # key: what the zygote's bwrap options depend on (the size of its /tmp)
        lease = self._zygotes.lease(limits.file_size_mb, self._start_zygote)
        zygote = resources.enter_context(lease)
        uid = resources.enter_context(uid_slot()) if self.drops_root else -1
        group = MemoryGroup.create(limits.memory_mb * 1024 * 1024)
        if group is not None:
            resources.callback(group.remove)
        stdout_read, stdout_write = (resources.enter_context(end) for end in pipe())
        stderr_read, stderr_write = (resources.enter_context(end) for end in pipe())
        ready_read, ready_write = (resources.enter_context(end) for end in pipe())
        child_ends = [
            resources.enter_context(memfd("stdin", stdin.encode("utf-8", "replace"))),
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
        return ZygoteProgram(zygote, stdout_read, stderr_read, ready_read, group)

    def _start_zygote(self) -> Zygote:
        """A zygote in a fresh bwrap sandbox with this sandbox's options (its /tmp size)."""
        sweep_stale_host_dirs()
        ctrl, child_ctrl = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        status_read, status_write = os.pipe()
        child_fds = [child_ctrl.detach(), status_write]
        host_dir = tempfile.TemporaryDirectory(prefix=f"{HOST_DIR_PREFIX}{os.getpid()}-")
        script = Path(host_dir.name) / SCRIPT_NAME
        script.touch(0o644)  # rewritten per program (Zygote.write_script)
        options = bwrap_options(self.limits, self.interpreter, None, status_write)
        options += ["--ro-bind", str(script), SANDBOX_SCRIPT]
        # Not --die-with-parent: that follows the thread that started bwrap, and a zygote
        # outlives the pool worker that started it. The zygote exits (killing its program)
        # when its socket closes, as it does when this process dies.
        options.remove("--die-with-parent")
        options.append("--as-pid-1")  # the zygote is the namespace's init (sandbox.zygote)
        if self.seccomp is not None:
            with memfd("seccomp.bpf", self.seccomp) as seccomp_file:
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
            whole_cpu_seconds(limits),
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
            BOOTSTRAP,
            *(str(number) for number in self._limit_numbers(uid)),
            str(fds.ready_write.fileno()),
            str(cgroup_fd),
            str(int(self.site_packages)),
            str(int(self.bwrap is not None)),
        ]
        shared = [fds.ready_write.fileno()] + ([cgroup_fd] if cgroup_fd >= 0 else [])
        if self.bwrap is None:
            return [*bootstrap, "main.py"], tuple(shared)
        options = bwrap_options(
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
        self.script = resources.enter_context(file_with(host_tmp / "main.py", code))
        self.stdin = resources.enter_context(file_with(host_tmp / "stdin", stdin))
        self.ready_read, self.ready_write = (resources.enter_context(end) for end in pipe())
        self.status_read, self.status_write = (resources.enter_context(end) for end in pipe())
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

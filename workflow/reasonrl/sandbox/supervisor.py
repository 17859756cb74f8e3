"""The caller's side of a running program: reads its output, enforces the wall clock, the output
cap and cancellation, kills and reaps it, and classifies its end (for a fresh sandbox and for a
zygote's program).
"""

from __future__ import annotations

import codecs
import contextlib
import json
import math
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from reasonrl.sandbox.cgroups import MemoryGroup
from reasonrl.sandbox.results import CancelToken, SandboxLimits, SandboxResult
from reasonrl.sandbox.zygote import (
    Zygote,
)

READ_CHUNK = 65536

_KILL_GRACE_SECONDS = 2.0

ZYGOTE_KILL_GRACE_SECONDS = 5.0  # a zygote kills every process of the program, then answers

_MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory", "out of memory")

# The kernel charges CPU time by whole scheduler ticks, so a program can reach its CPU limit a
# tick or so before our wall clock shows that much time (seen: SIGKILL at 1.9988 s of wall
# clock under a 2 s hard limit, in CI).
_CPU_ACCOUNTING_SLACK_SECONDS = 0.05

_STDERR_FLOOD_FACTOR = 64  # stderr may exceed the kept cap this many times over


class Supervisor:
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
        return read_nonblocking(ready_fd) == b"1"

    def _ended(self) -> bool:
        """Whether the sandbox is gone by itself (without bwrap, background processes may
        outlive the program: its group is killed whatever happened)."""
        return self.sandboxed and wait_readable(self.pidfd, 0)

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
                    data = os.read(key.fd, READ_CHUNK)
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
            send_signal(lambda: os.kill(self.sandbox_pid, signal.SIGKILL))
            if wait_readable(self.pidfd, _KILL_GRACE_SECONDS):
                return
        send_signal(lambda: os.killpg(self.process.pid, signal.SIGKILL))

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
            wait_readable(self.sandbox_pidfd, _KILL_GRACE_SECONDS)
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


class ZygoteSupervisor(Supervisor):
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
        self.wait_status = self.zygote.exit_status(ZYGOTE_KILL_GRACE_SECONDS)

    def _reap(self) -> int:
        try:
            if self.wait_status is None:
                self.wait_status = self.zygote.exit_status(ZYGOTE_KILL_GRACE_SECONDS)
            return self.wait_status
        finally:
            self.stdout.close()
            self.stderr.close()

    def _program_returncode(self, exitcode: int) -> int:
        return os.waitstatus_to_exitcode(exitcode)


@dataclass(frozen=True)
class ZygoteProgram:
    """A program a zygote has started: the zygote, our ends of its pipes, its memory group."""

    zygote: Zygote
    stdout: BinaryIO
    stderr: BinaryIO
    ready: BinaryIO
    group: MemoryGroup | None


def file_with(path: Path, text: str) -> BinaryIO:
    path.write_text(text, encoding="utf-8", errors="replace")
    return open(path, "rb")  # noqa: SIM115 (the caller's ExitStack closes it)


def memfd(name: str, data: bytes) -> BinaryIO:
    """An anonymous in-memory file holding data, read from its start."""
    memfd = os.fdopen(os.memfd_create(name, os.MFD_CLOEXEC), "w+b", buffering=0)
    memfd.write(data)
    memfd.seek(0)
    return memfd


def pipe() -> tuple[BinaryIO, BinaryIO]:
    """A pipe as unbuffered file objects, so closing one end twice is harmless."""
    read_fd, write_fd = os.pipe()
    return os.fdopen(read_fd, "rb", buffering=0), os.fdopen(write_fd, "wb", buffering=0)


def send_signal(send) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        send()


def wait_readable(fd: int, seconds: float) -> bool:
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        return bool(selector.select(seconds))


def read_nonblocking(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 1)
    except BlockingIOError:
        return b""

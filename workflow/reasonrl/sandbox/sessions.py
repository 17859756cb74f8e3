"""Sessions (the tool loop's notebook): one forked process keeps its namespace across cells, each
printing what the re-run of the cells before it would print.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from typing import TYPE_CHECKING

from reasonrl.sandbox.results import (
    CancelToken,
    SandboxLimits,
    SandboxResult,
    cancelled_before,
    refused,
)
from reasonrl.sandbox.supervisor import (
    READ_CHUNK,
    ZYGOTE_KILL_GRACE_SECONDS,
    ZygoteSupervisor,
    read_nonblocking,
    wait_readable,
)
from reasonrl.sandbox.zygote import (
    ZygoteBroken,
)

if TYPE_CHECKING:
    from reasonrl.sandbox.runner import Sandbox

_STALE_READS = 64  # at most this many chunks of a session's between-cells output are skipped


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
    re-run would (see reasonrl.sandbox.zygote's make_runner). Its limits are that program's too:
    RLIMIT_CPU and the memory cap hold for the process's whole life (the re-run's CPU time
    and memory are the earlier cells'), and a cell's wall clock is what the earlier cells of
    the process left of wall_seconds. What a re-run would not repeat exactly (the clock, pids,
    unseeded random numbers, object addresses) can differ, as it differs between two
    re-runs, and so can the frames below the cell (the session's runner is not
    run_program) and their count where the pool would run the re-run program in a fresh
    sandbox (a batch no larger than its workers) rather than a zygote.

    The process is a session-mode program of a zygote leased for the session's life (the
    pool's zygotes while sandbox.warm() is open; see reasonrl.sandbox.zygote): seccomp-filtered,
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
            if cancelled_before(start, cancel, deadline):
                return SandboxResult("cancelled", "", "", None, 0.0)
            return self._run_cell(program, start, cancel, deadline)
        except Exception as exc:  # as Sandbox.run: the caller survives, the session ends
            self.close()
            return refused(exc, start)
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
        self._ready = self._ready or read_nonblocking(self.program.ready.fileno()) == b"1"
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
            zygote.exit_status(ZYGOTE_KILL_GRACE_SECONDS)
            self.ended = True
            return False
        return True

    def _skip_stale_output(self) -> None:
        """What the session's threads or processes wrote between cells, to its pipes or to
        its channel, is no cell's output and no cell's end."""
        for source in (self.program.stdout, self.program.stderr, self.channel):
            for _ in range(_STALE_READS):
                if not wait_readable(source.fileno(), 0):
                    break
                if not os.read(source.fileno(), READ_CHUNK):
                    break

    def close(self) -> None:
        zygote = self.program.zygote
        try:
            if not self.ended and not zygote.broken:
                zygote.kill_program()
                zygote.exit_status(ZYGOTE_KILL_GRACE_SECONDS)
        except ZygoteBroken:
            pass  # its whole sandbox was killed, and its lease closes it
        finally:
            self._resources.close()


class _SessionSupervisor(ZygoteSupervisor):
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
            while wait_readable(source.fileno(), 0):
                data = os.read(source.fileno(), READ_CHUNK)
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
            self.wait_status = self.zygote.exit_status(ZYGOTE_KILL_GRACE_SECONDS)
        return self.wait_status


def _cell_token() -> bytes:
    """What a session's process must send back, before the exit status, to end a cell: a
    stray or stale message on the channel cannot guess it."""
    return secrets.token_hex(8).encode()

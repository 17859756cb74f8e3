"""How a sandboxed program ended (STATUSES, SandboxResult, what the model is shown), its limits,
and the token that cancels a batch.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, fields

STATUSES = ("ok", "error", "timeout", "memory", "output-limit", "refused", "cancelled")

_TAIL_LINES = 5

_TRACEBACK_HEADER = "Traceback (most recent call last):"

_PROGRAM_FILE_MARK = 'main.py", line '  # how a traceback names a frame of the program itself


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


def whole_cpu_seconds(limits: SandboxLimits) -> int:
    """RLIMIT_CPU counts whole seconds."""
    return max(1, math.ceil(limits.cpu_seconds))


def cancelled_before(start: float, cancel: CancelToken | None, deadline: float | None) -> bool:
    cancelled = cancel is not None and cancel.cancelled
    return cancelled or (deadline is not None and deadline <= start)


def refused(exc: Exception, start: float) -> SandboxResult:
    """The result of a run whose sandbox failed (never of anything the program did)."""
    message = f"sandbox failed: {type(exc).__name__}: {exc}"
    return SandboxResult("refused", "", message, None, time.monotonic() - start)

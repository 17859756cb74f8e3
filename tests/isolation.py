"""Keep tests independent of how pytest was started and of other processes on the machine.

A test run may start with SIGINT ignored (`nohup make test &`, some CI runners): a test that
sends SIGINT sets the receiver's disposition itself. A "no process left" check counts only
the sandboxes of processes the test started, never every sandbox on the host.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import Iterable, Iterator
from pathlib import Path

from reasonrl.sandbox import HOST_DIR_PREFIX, SANDBOX_UIDS

# A sandbox's memory cgroup and its host folder (bwrap's working folder) are both named
# reasonrl-sandbox-<pid of the process that ran it>-...
CALLER_MARK = re.compile(re.escape(HOST_DIR_PREFIX) + r"(\d+)-")


def default_signals() -> None:
    """preexec_fn of a child a test will signal: SIGINT and SIGTERM as a terminal gives them
    (Python then raises KeyboardInterrupt on SIGINT), whatever this process inherited."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


@contextlib.contextmanager
def keyboard_interrupt_on_sigint() -> Iterator[None]:
    """In this process, SIGINT raises KeyboardInterrupt inside the block (it may have started
    ignored), and is put back afterwards."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _uid(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None  # exited while we looked
    found = re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE)
    return int(found[1]) if found else None


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def caller_of(pid: int) -> int | None:
    """The pid of the process that ran the sandbox `pid` belongs to, from its memory cgroup's
    name, else from the working folder of its bwrap ancestor (None: not found)."""
    with contextlib.suppress(OSError):
        found = CALLER_MARK.search(Path(f"/proc/{pid}/cgroup").read_text())
        if found:
            return int(found[1])
    ancestor = pid
    while ancestor and ancestor > 1:
        with contextlib.suppress(OSError):
            found = CALLER_MARK.search(os.readlink(f"/proc/{ancestor}/cwd"))
            if found:
                return int(found[1])
        ancestor = _parent(ancestor)
    return None


def sandbox_processes(callers: Iterable[int] = ()) -> list[int]:
    """Host pids running as a sandbox uid whose sandbox this process ran, or one of `callers`
    (processes the test started, alive or killed)."""
    owners = {os.getpid(), *callers}
    pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    return [pid for pid in pids if _uid(pid) in SANDBOX_UIDS and caller_of(pid) in owners]

"""Keep tests independent of how pytest was started and of other processes on the machine.

A test run may start with SIGINT ignored (`nohup make test &`, some CI runners): a test that
sends SIGINT sets the receiver's disposition itself. A "no process left" check counts only
the sandboxes of processes the test started, never every sandbox on the host: as root the
processes of sandbox uids, without root the processes of this uid in a sandbox's namespaces.
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


def _user_namespace(pid: int) -> str | None:
    with contextlib.suppress(OSError):
        return os.readlink(f"/proc/{pid}/ns/user")
    return None


def _namespace_pids(pid: int) -> list[int]:
    """The pid of `pid` in each pid namespace it is in, the host's first."""
    with contextlib.suppress(OSError):
        status = Path(f"/proc/{pid}/status").read_text()
        found = re.search(r"^NSpid:\s+([\d\s]+)$", status, re.MULTILINE)
        if found:
            return [int(number) for number in found[1].split()]
    return []


def _host_ancestor(pid: int) -> int | None:
    """The nearest ancestor of `pid` in this process's user namespace (a sandbox's bwrap, the
    process that ran it, or the host's init for an orphan)."""
    ours = _user_namespace(os.getpid())
    ancestor = _parent(pid)
    while ancestor and _user_namespace(ancestor) != ours:
        ancestor = _parent(ancestor)
    return ancestor


def _program_of_ours(pid: int, owners: set[int]) -> bool:
    """Without root: whether `pid`, a process of our uid in a user namespace of its own, is a
    program of a sandbox that one of `owners` ran (or an orphan that nobody's sandbox holds).
    A sandbox's init (the zygote, or the bootstrap's init) is the sandbox, not a program."""
    if _uid(pid) != os.geteuid() or _user_namespace(pid) in (None, _user_namespace(os.getpid())):
        return False
    if _namespace_pids(pid)[-1:] == [1]:
        return False
    ancestor = _host_ancestor(pid)
    return ancestor in owners or ancestor == 1 or caller_of(ancestor or pid) in owners


def sandbox_processes(callers: Iterable[int] = ()) -> list[int]:
    """Host pids of programs run in a sandbox by this process or one of `callers` (processes
    the test started, alive or killed): as root, processes of a sandbox uid; without root,
    processes of this uid in a sandbox's user namespace."""
    owners = {os.getpid(), *callers}
    pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    if os.geteuid() != 0:
        return [pid for pid in pids if _program_of_ours(pid, owners)]
    return [pid for pid in pids if _uid(pid) in SANDBOX_UIDS and caller_of(pid) in owners]

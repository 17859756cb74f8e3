"""Be a child subreaper while sandboxes run, so that each run reaps its own bwrap init.

bwrap's outer process exits as soon as the program's exit status is known, before the
sandbox's pid 1 (bwrap's init) has exited; that pid 1 would be reparented to the host's init,
which in a container may never reap it. While runs (or warm zygotes) are in progress the
caller is a child subreaper (orphans of its descendants come to it rather than to init), and
each reaps its pid 1 through a pidfd opened while it was alive: no zombie outlives a run.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
from collections.abc import Iterator

PR_SET_CHILD_SUBREAPER = 36
_lock = threading.Lock()
_users = 0  # runs in progress in this process (pid _pid)
_pid = 0


@contextlib.contextmanager
def as_subreaper() -> Iterator[None]:
    """While runs are in progress, orphans of our descendants (each run's bwrap init) come to
    us, not to init, so that each run reaps its own; off again once none is, so that other
    orphans (of other processes' descendants) go on to init as before."""
    global _users, _pid
    with _lock:
        if _pid != os.getpid():  # a forked child: not a subreaper, whatever we were
            _users, _pid = 0, os.getpid()
        if _users == 0:
            _set_subreaper(1)
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                _set_subreaper(0)


def _set_subreaper(on: int) -> None:
    if _libc().prctl(PR_SET_CHILD_SUBREAPER, on, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)

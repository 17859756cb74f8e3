"""What the sandbox guarantees only as root or with a memory cgroup (said once, refused under
sandbox.require), and the per-sandbox uids root hands out.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from reasonrl.errors import ReasonRLError
from reasonrl.sandbox.cgroups import memory_parent

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


def weaker_guarantees(drops_root: bool) -> list[str]:
    """The GUARANTEES that do not hold for this runner."""
    missing = [] if drops_root else ["own_uid"]
    return missing + ([] if memory_parent() is not None else ["memory_group"])


def hold_guarantees(missing: list[str], require: Sequence[str]) -> None:
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


@contextlib.contextmanager
def uid_slot() -> Iterator[int]:
    """A sandbox uid that no other running sandbox on this host holds (a flock per uid)."""
    folder = open_lock_folder()
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


def open_lock_folder() -> int:
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

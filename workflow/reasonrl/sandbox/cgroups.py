"""A memory cgroup per sandbox run, so the memory cap holds for all its processes together.

RLIMIT_AS caps each process; a program that forks 30 children could still take 30 times the
cap. When the host lets us create cgroups (root, with a cgroup v1 memory hierarchy or a v2
hierarchy whose memory controller is delegated to our group), each run gets a child group
of ours with the cap on memory (and swap); the sandbox's bootstrap joins it before anything
else runs, and the run is classified "memory" when the kernel's OOM killer acted in it.
Without such a hierarchy `MemoryGroup.create` returns None and the per-process cap is all.

Groups are named after the pid that made them. A caller killed by a signal cannot remove
its groups, so each `create` first removes the (empty) groups of pids no longer alive.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP_PREFIX = "reasonrl-sandbox-"
_REMOVE_TRIES = 50
_REMOVE_PAUSE_S = 0.01


def _own_groups() -> dict[str, str]:
    """controller (or "" for v2) -> our group's path, from /proc/self/cgroup."""
    groups = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                groups[controller] = path
    return groups


def owner_is_gone(name: str, prefix: str = GROUP_PREFIX) -> bool:
    """Whether `name` is PREFIX<pid>-... of a pid that no longer runs."""
    pid, dash, _ = name[len(prefix) :].partition("-")
    if not name.startswith(prefix) or not pid.isdigit() or not dash:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def sweep_stale(parent: Path) -> None:
    """Remove the groups left by callers that were killed (rmdir only removes empty ones)."""
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        for entry in entries:  # the name first: a group folder sits among ~30 control files
            if owner_is_gone(entry.name) and entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.rmdir(entry.path)


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


def memory_parent() -> tuple[Path, int] | None:
    """(the folder under which our memory groups go, cgroup version), or None."""
    groups = _own_groups()
    if "memory" in groups:  # v1: a hierarchy per controller
        parent = CGROUP_ROOT / "memory" / groups["memory"].lstrip("/")
        if _writable_dir(parent) and (parent / "memory.limit_in_bytes").exists():
            return parent, 1
    if "" in groups:  # v2: memory must be enabled for our group's children
        for mount in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
            parent = mount / groups[""].lstrip("/")
            control = parent / "cgroup.subtree_control"
            with contextlib.suppress(OSError):
                if _writable_dir(parent) and "memory" in control.read_text().split():
                    return parent, 2
    return None


class MemoryGroup:
    """One run's cgroup: created with its cap, joined by the bootstrap, removed afterwards."""

    def __init__(self, path: Path, version: int) -> None:
        self.path = path
        self.version = version

    @classmethod
    def create(cls, memory_bytes: int) -> MemoryGroup | None:
        """A fresh group capped at memory_bytes, or None where the host has none for us."""
        found = memory_parent()
        if found is None:
            return None
        parent, version = found
        sweep_stale(parent)
        path = parent / f"{GROUP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        try:
            path.mkdir()
        except OSError:
            return None
        group = cls(path, version)
        try:
            group._set_cap(memory_bytes)
        except OSError:
            group.remove()
            return None
        return group

    def _set_cap(self, memory_bytes: int) -> None:
        if self.version == 1:
            (self.path / "memory.limit_in_bytes").write_text(str(memory_bytes))
            swap = self.path / "memory.memsw.limit_in_bytes"
            if swap.exists():  # memory + swap, so the program cannot page its way past the cap
                swap.write_text(str(memory_bytes))
        else:
            (self.path / "memory.max").write_text(str(memory_bytes))
            swap = self.path / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")

    def open_procs(self) -> int:
        """A write-only fd of cgroup.procs, for the bootstrap to join the group with."""
        return os.open(self.path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer killed a process of this group."""
        events = "memory.oom_control" if self.version == 1 else "memory.events"
        with contextlib.suppress(OSError):
            for line in (self.path / events).read_text().splitlines():
                name, _, count = line.partition(" ")
                if name == "oom_kill" and int(count) > 0:
                    return True
        return False

    def remove(self) -> None:
        """Remove the (emptied) group; its last processes may take a moment to leave it."""
        for _ in range(_REMOVE_TRIES):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(_REMOVE_PAUSE_S)

"""Sandbox hygiene on the host: the uid lock folder is ours alone, and no run leaves a zombie."""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path

import pytest

from reasonrl.errors import ReasonRLError
from reasonrl.sandbox import Sandbox, SandboxLimits
from reasonrl.sandbox import guarantees as guarantees_module
from reasonrl.sandbox.pool import Program, WorkerPool

# 10,000 runs took 164 s on two cores shared with other work; a lower count gives a quick look.
ZOMBIE_RUNS = int(os.environ.get("REASONRL_ZOMBIE_RUNS", "10000"))
KILLED_RUNS = 10
PR_GET_CHILD_SUBREAPER = 37
FAST = SandboxLimits(cpu_seconds=1, wall_seconds=1, memory_mb=256, max_output_chars=256)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the uid lock folder is used as root")


@pytest.fixture
def lock_folder(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "reasonrl-sandbox-uids"
    monkeypatch.setattr(guarantees_module, "UID_LOCK_DIR", path)
    return path


def take_a_uid() -> int:
    with guarantees_module.uid_slot() as uid:
        return uid


def test_a_missing_lock_folder_is_made_ours_with_mode_0700(lock_folder):
    assert take_a_uid() == guarantees_module.SANDBOX_UIDS[0]
    info = lock_folder.stat()
    assert info.st_uid == os.geteuid() and info.st_mode & 0o777 == 0o700
    assert (lock_folder / f"{guarantees_module.SANDBOX_UIDS[0]}.lock").exists()
    assert take_a_uid() == guarantees_module.SANDBOX_UIDS[0]  # the lock was released


def test_a_planted_symlink_is_refused_and_nothing_is_made_through_it(lock_folder, tmp_path):
    target = tmp_path / "victim"
    target.mkdir(mode=0o700)
    lock_folder.symlink_to(target)
    with pytest.raises(ReasonRLError, match="is a symbolic link or not a folder") as refused:
        take_a_uid()
    assert str(lock_folder) in str(refused.value) and "\n" not in str(refused.value)
    assert list(target.iterdir()) == []


def test_a_file_in_its_place_is_refused(lock_folder):
    lock_folder.write_text("")
    with pytest.raises(ReasonRLError, match="is a symbolic link or not a folder"):
        take_a_uid()


def test_a_folder_open_to_others_is_refused(lock_folder):
    lock_folder.mkdir()
    lock_folder.chmod(0o777)
    with pytest.raises(ReasonRLError, match="with mode 0777, not to this runner .* mode 0700"):
        take_a_uid()
    assert list(lock_folder.iterdir()) == []


@needs_root
def test_another_users_folder_is_refused_when_the_sandbox_is_made(lock_folder):
    lock_folder.mkdir(mode=0o700)
    os.chown(lock_folder, 65534, 65534)
    with pytest.raises(ReasonRLError, match="belongs to uid 65534") as refused:
        Sandbox(FAST)
    assert "\n" not in str(refused.value)
    assert list(lock_folder.iterdir()) == []


def zombies() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command) of every zombie process."""
    found = {}
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat_file.read_text()
        except OSError:
            continue  # gone while we looked
        command, fields = text[text.index("(") + 1 : text.rindex(")")], text.rsplit(")", 1)[1]
        state, parent = fields.split()[:2]
        if state == "Z":
            found[int(stat_file.parent.name)] = (int(parent), command)
    return found


@pytest.mark.timeout(900)
def test_no_zombie_after_many_runs_finished_or_killed():
    """Each run's bwrap init is reaped by us, not left to the host's init (which, in a
    container, may never reap it, or only seconds later: so we are a subreaper too)."""
    before = zombies()
    spin = Program("while True:\n    pass\n")
    # the killed runs first: the host's init may reap orphans itself, only a while later
    programs = [spin] * KILLED_RUNS + [Program("pass")] * ZOMBIE_RUNS
    started = time.monotonic()
    results = WorkerPool(Sandbox(FAST), workers=2).run(programs)
    seconds = time.monotonic() - started
    statuses = [r.status for r in results]
    assert statuses == ["timeout"] * KILLED_RUNS + ["ok"] * ZOMBIE_RUNS
    new = {pid: info for pid, info in zombies().items() if pid not in before}
    left = {pid: info for pid, info in new.items() if info[0] == os.getpid() or info[1] == "bwrap"}
    assert left == {}, f"{len(left)} zombies after {len(programs)} runs in {seconds:.0f} s"
    # we were a subreaper only while runs were in progress: other orphans go to init again
    libc = ctypes.CDLL(None, use_errno=True)
    flag = ctypes.c_int(-1)
    assert libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0
    assert flag.value == 0

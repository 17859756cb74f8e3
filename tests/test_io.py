"""Atomic artifact writes: never rename over something that is not a regular file; modes
follow the umask."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from reasonrl.errors import ReasonRLError
from reasonrl.io import read_jsonl, write_jsonl

REPO = Path(__file__).resolve().parents[1]


def test_write_replaces_a_regular_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("old\n")
    write_jsonl(path, [{"a": 1}])
    assert read_jsonl(path) == [{"a": 1}]


def test_write_refuses_a_fifo_or_folder_and_leaves_it_alone(tmp_path):
    # A device such as /dev/null (written to by root) is the case this guards; a FIFO is the
    # non-regular file a test can make without privileges.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    for path in (fifo, folder):
        with pytest.raises(ReasonRLError, match=f"{path}: exists and is not a regular file"):
            write_jsonl(path, [{"a": 1}])
    assert stat.S_ISFIFO(fifo.stat().st_mode) and folder.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "folder"]  # no temp left


MAKE_DATA_AND_POLICY = """
import sys
from reasonrl.cli import main
out = sys.argv[1]
main(["make-data", "--config", "config/test.yaml", "--task", "arith", "--out-dir", out + "/data"])
main(["build-tiny", "--config", "config/test.yaml", "--corpus", out + "/data/train.jsonl",
      "--out", out + "/models/base"])
"""


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_outputs_follow_the_umask(tmp_path, umask):
    """Atomic writes start from mkstemp (0600) / mkdtemp (0700) files: what the stages leave
    must still have the modes a plain open or mkdir gives under the user's umask."""
    subprocess.run(
        [sys.executable, "-c", MAKE_DATA_AND_POLICY, str(tmp_path / "out")],
        cwd=REPO,
        preexec_fn=lambda: os.umask(umask),
        check=True,
        capture_output=True,
    )
    paths = sorted((tmp_path / "out").rglob("*"))
    assert {p.name for p in paths} >= {"train.jsonl", "manifest.json", "model.safetensors"}
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in paths}
    expected = {name: (0o777 if (tmp_path / name).is_dir() else 0o666) & ~umask for name in modes}
    assert modes == expected


def fsynced_paths(monkeypatch) -> list[Path]:
    """Record the path of every descriptor fsynced (and which names existed at the time)."""
    synced: list[Path] = []
    real = os.fsync

    def record(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    return synced


def test_an_atomic_write_fsyncs_the_file_before_the_rename_and_the_folder_after(
    tmp_path, monkeypatch
):
    synced = fsynced_paths(monkeypatch)
    write_jsonl(tmp_path / "rows.jsonl", [{"a": 1}])
    temp, folder = synced
    assert temp.parent == tmp_path and temp.name.startswith(".rows.jsonl.")  # before rename
    assert folder == tmp_path


def test_a_saved_folder_and_a_checkpoint_are_fsynced_before_their_rename(tmp_path, monkeypatch):
    from reasonrl.models import save_folder_atomically
    from reasonrl.training.loop import CheckpointStore

    synced = fsynced_paths(monkeypatch)
    save_folder_atomically(tmp_path / "model", lambda tmp: (tmp / "weights").write_text("w"))
    temp = synced[-2]
    assert temp.name.startswith(".model.") and temp.parent == tmp_path
    assert any(p.name == "weights" and p.parent == temp for p in synced)
    assert synced[-1] == tmp_path

    class OneProcess:  # the part of accelerate's Accelerator the store uses
        is_main_process = True

        def wait_for_everyone(self) -> None:
            pass

        def save_state(self, folder: str) -> None:
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / "model.safetensors").write_text("state")

    synced.clear()
    CheckpointStore(tmp_path / ".run.ckpt", "stamp").save(OneProcess(), 3, [])
    ckpt = tmp_path / ".run.ckpt"
    assert any(p.name == "model.safetensors" and p.parent.name == ".tmp-step-3" for p in synced)
    assert any(p.name == "loop.json" for p in synced)
    assert synced[-1] == ckpt and (ckpt / "step-3" / "loop.json").is_file()

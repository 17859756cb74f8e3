"""Atomic artifact writes: never rename over something that is not a regular file."""

import os
import stat

import pytest

from reasonrl.errors import ReasonRLError
from reasonrl.io import read_jsonl, write_jsonl


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

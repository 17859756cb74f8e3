"""tests/side_by_side.py: the learning tests' worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from side_by_side import SideBySide


def worker_facts() -> dict:
    import multiprocessing

    import torch

    child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0,))
    child.start()  # a daemon worker could not: async online DPO starts its generator so
    child.join()
    return {"pid": os.getpid(), "threads": torch.get_num_threads(), "child": child.exitcode}


def sleep_forever(pid_file: str) -> None:
    Path(pid_file).write_text(str(os.getpid()))
    time.sleep(3600)


def test_workers_run_jobs_on_one_torch_thread_and_may_start_processes():
    pool = SideBySide(workers=2)
    try:
        facts = [pool.submit(worker_facts) for _ in range(2)]
        for fact in (f.result(timeout=120) for f in facts):
            assert fact["pid"] != os.getpid()
            assert fact["threads"] == 1
            assert fact["child"] == 0
    finally:
        pool.close()


def test_close_stops_a_running_job_at_once(tmp_path):
    pool = SideBySide(workers=1)
    pid_file = tmp_path / "pid"
    pool.submit(sleep_forever, str(pid_file))
    deadline = time.monotonic() + 120
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    worker = int(pid_file.read_text())
    started = time.monotonic()
    pool.close()
    assert time.monotonic() - started < 30
    assert not Path(f"/proc/{worker}").exists()  # killed and reaped


CLOSE_WHILE_STARTING = """
import os, sys
sys.path.insert(0, sys.argv[1])
from side_by_side import SideBySide
for _ in range(3):
    pool = SideBySide(workers=2)
    jobs = [pool.submit(os.getpid) for _ in range(2)]
    jobs[0].result(timeout=120)
    pool.close()  # the second worker may still be starting, or reporting
"""


def test_close_leaves_no_worker_for_the_exit_to_wait_on():
    """A worker still starting when close() ran was missed, and the interpreter's exit, which
    joins the executor's workers, waited on it for ever (a CI run hung so, 2026-11-28)."""
    done = subprocess.run(
        [sys.executable, "-c", CLOSE_WHILE_STARTING, str(Path(__file__).parent)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]

"""Independent runs of a learning test, side by side in worker processes of one torch thread.

On this 2-core machine single-threaded runs side by side do more work than one run on two
threads (measured 2026-11-28, config.yaml's tiny policy: 60 padded training steps of 16 rows,
0.583 s a step each side by side against 0.357 s alone on two threads, 1.22x; greedy
generation of 64 x 128 tokens, 4.0 s each against 2.75 s, 1.4x), with bit-identical results:
the same parameters after those 60 steps, the same generated tokens, on one thread or two.
Torch processes of two threads each side by side would be far slower (2-10x: OpenMP threads
waiting on each other, see reasonrl.stages.online_dpo), hence one thread a worker.

Workers are spawned (never forked from a process whose torch has started its thread pools),
are not daemons (a run may start processes of its own: async online DPO's generator), and are
killed when the module's tests end, finished or not.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any


def _start_worker() -> None:
    # before torch is imported: OpenMP and MKL read these as they start
    os.environ.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    import torch

    torch.set_num_threads(1)


class SideBySide:
    """`workers` spawned processes with one torch thread each; jobs start in the order they
    are submitted, each on the first worker free."""

    def __init__(self, workers: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._executor = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker)

    def submit(self, job: Callable[..., Any], *args: Any) -> Future:
        return self._executor.submit(job, *args)

    def close(self) -> None:
        """Stop every worker now, running jobs included (a job's own children die with it:
        the generator asks Linux for that, bwrap runs with --die-with-parent)."""
        # Every worker the executor started (only submit() starts them, one per job while
        # fewer than `workers` exist; the executor has no public kill). A job submitted from
        # another thread after this read would start none: the learning file's chained runs
        # come after five jobs that started all three. Each is killed: one killed while it
        # holds the result queue's lock would leave any other stuck on it, and the
        # interpreter's exit, which joins them, hung (a worker that had not yet reported its
        # pid was missed so).
        workers = list((self._executor._processes or {}).values())
        self._executor.shutdown(wait=False, cancel_futures=True)
        for worker in workers:
            worker.kill()
        for worker in workers:
            worker.join()
        self._executor.shutdown(wait=True)

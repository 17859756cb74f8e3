"""The worker pool: many programs, each in a sandbox of its own, a bounded number at a time.

Every program that reasonrl runs (the tool loop's cells, code grading, benchmark
evaluation) goes through `WorkerPool.run` (which calls `Sandbox.run` for each): results come
back in input order with their status, duration and capped output. At most `workers`
sandboxes run at once, and fewer when `memory_mb` (the pool's memory budget) cannot hold
that many sandboxes' memory caps. A batch can be cancelled (`cancel()`, from any thread) or
given a deadline; programs still running are killed and those not started are not started
("cancelled"). A sandbox that cannot start programs does not hand back a batch of refusals
to be written as results: when most of a batch is "refused", `run` raises SandboxRefused
naming the cause. Worker threads only wait on their sandboxes, so an interrupt of the caller
(KeyboardInterrupt, any exception) cancels the batch and returns only once every sandbox
is killed and reaped: no process and no zombie outlives a batch. In a batch of more programs
than workers, the sandbox's zygotes (one warm interpreter per worker, see reasonrl.sandbox.zygote)
run them; they live for the batch and are closed with it.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

from tqdm import tqdm

from reasonrl.errors import ReasonRLError
from reasonrl.sandbox.results import CancelToken, SandboxLimits, SandboxResult
from reasonrl.sandbox.runner import Sandbox
from reasonrl.sandbox.sessions import Session

# How long a wait goes before it lets the caller's interrupts through (they may be only
# flagged, as _thread.interrupt_main does, not signalled); the rollout's waits share it.
POLL_SECONDS = 0.2
_CAUSE_CHARS = 300
# bwrap's words when it may not make the sandbox's namespaces, and what to do about it
_NO_NAMESPACES = ("namespace", "uid map", "setting up uid")
NAMESPACES_HINT = (
    "unprivileged user namespaces are refused here (sysctl user.max_user_namespaces or "
    "kernel.unprivileged_userns_clone on a host; a container's seccomp or AppArmor profile): "
    "allow them, or run as root"
)


class SandboxRefused(ReasonRLError):
    """Most programs of a batch were refused: the sandbox cannot run programs here."""


@dataclass(frozen=True)
class Program:
    """A program of a batch; limits=None takes the pool's sandbox limits. With a session,
    the code is that session's next cell (its sandbox's limits, no stdin)."""

    code: str
    stdin: str = ""
    limits: SandboxLimits | None = None
    session: Session | None = None


class WorkerPool:
    """Runs batches of programs in sandboxes of `sandbox`, at most `concurrency` at once."""

    def __init__(
        self, sandbox: Sandbox, workers: int | None = None, memory_mb: int | None = None
    ) -> None:
        self.sandbox = sandbox
        workers = sandbox.workers if workers is None else workers
        memory_mb = sandbox.pool_memory_mb if memory_mb is None else memory_mb
        self.concurrency = max(1, workers)
        if memory_mb:
            self.concurrency = min(self.concurrency, memory_mb // sandbox.limits.memory_mb)
            self.concurrency = max(1, self.concurrency)
        self._token: CancelToken | None = None
        self._lock = threading.Lock()

    def cancel(self) -> None:
        """Stop the batch in progress (if any): its remaining programs end "cancelled"."""
        with self._lock:
            if self._token is not None:
                self._token.cancel()

    def run(
        self,
        programs: Sequence[str | Program],
        deadline_seconds: float | None = None,
        progress: str | None = None,
        cancel: CancelToken | None = None,
    ) -> list[SandboxResult]:
        """Run a batch; results in input order.

        deadline_seconds: the whole batch's time; what has not finished by then is
        "cancelled". progress: a description to show a progress bar with (None: no bar).
        cancel: a token of the caller's (which it closes) that cancels the batch too, even
        one cancelled before the batch started (every program then ends "cancelled").
        """
        items = [p if isinstance(p, Program) else Program(p) for p in programs]
        if not items:
            return []
        deadline = None if deadline_seconds is None else time.monotonic() + deadline_seconds
        token = cancel or CancelToken()
        with self._lock:
            self._token = token
        try:
            # Zygotes pay off from a worker's second program on; they live for the batch.
            warm = self.sandbox.warm() if len(items) > self.concurrency else nullcontext()
            with warm:
                results = self._run_batch(items, token, deadline, progress)
        finally:
            with self._lock:
                self._token = None
            if cancel is None:
                token.close()
        _stop_on_refusals(results)
        return results

    def _run_batch(
        self, items: list[Program], token: CancelToken, deadline: float | None, progress
    ) -> list[SandboxResult]:
        results: list[SandboxResult | None] = [None] * len(items)
        todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        for index in range(len(items)):
            todo.put(index)
        finished: queue.SimpleQueue[int] = queue.SimpleQueue()

        def work() -> None:
            while True:
                try:
                    index = todo.get_nowait()
                except queue.Empty:
                    return
                results[index] = self._run_one(items[index], token, deadline)
                finished.put(index)

        threads = [
            threading.Thread(target=work, name=f"sandbox-worker-{i}", daemon=True)
            for i in range(min(self.concurrency, len(items)))
        ]
        for thread in threads:
            thread.start()
        try:
            with tqdm(total=len(items), desc=progress, disable=progress is None) as bar:
                for _ in items:
                    _wait_for(finished)
                    bar.update()
        except BaseException:
            token.cancel()  # the caller was interrupted: kill what runs, start nothing new
            raise
        finally:
            for thread in threads:
                thread.join()
        return results  # type: ignore[return-value]  (every index was filled)

    def _run_one(self, item: Program, token: CancelToken, deadline: float | None) -> SandboxResult:
        if item.session is not None:
            return item.session.run(item.code, cancel=token, deadline=deadline)
        sandbox = self.sandbox
        if item.limits is not None:
            sandbox = sandbox.with_limits(item.limits)
        return sandbox.run(item.code, item.stdin, cancel=token, deadline=deadline)


def _stop_on_refusals(results: list[SandboxResult]) -> None:
    """Raise SandboxRefused when most of a batch was refused (a refusal is never the
    program's doing: the sandbox could not start it), naming the first one's cause."""
    refused = [result for result in results if result.status == "refused"]
    if refused and 2 * len(refused) > len(results):
        lines = [line for line in refused[0].stderr.strip().splitlines() if line.strip()]
        cause = (lines[-1] if lines else "no message")[:_CAUSE_CHARS]
        if os.geteuid() != 0 and any(word in cause.lower() for word in _NO_NAMESPACES):
            cause = f"{cause} ({NAMESPACES_HINT})"
        raise SandboxRefused(
            f"the sandbox refused {len(refused)} of {len(results)} programs of a batch, "
            f"so nothing is computed from them: {cause}"
        )


def _wait_for(finished: queue.SimpleQueue) -> int:
    """The next finished index; waits in short slices so the caller's interrupts get through
    even when they are only flagged (as _thread.interrupt_main does), not signalled."""
    while True:
        try:
            return finished.get(timeout=POLL_SECONDS)
        except queue.Empty:
            continue

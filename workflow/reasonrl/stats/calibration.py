"""Calibration: is there headroom for a post-SFT method before any runs?

A method can only show an effect where the start policy neither solves nor fails
everything, and where its samples disagree: the preference pairs, reward-model data and PPO
advantages all come from problems with both a correct and a wrong sample. From the start
policy's greedy and sampled trajectories on the easy band (what SFT learned) and the
frontier band (what the methods work on), this measures greedy pass@1 on both, pass@k at the
sampling temperature on the frontier, and the share of frontier problems with mixed
samples, and checks them against configurable gates.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from reasonrl.errors import ReasonRLError
from reasonrl.stats.metrics import pass_at_k

# gate -> (measure, bound kind, what to change when it fails)
GATES = {
    "easy_min": ("easy_greedy", "min", "train SFT longer or on more easy problems"),
    "frontier_min": ("frontier_greedy", "min", "make the frontier band easier"),
    "frontier_max": ("frontier_greedy", "max", "make the frontier band harder"),
    "gap_min": (
        "frontier_pass_gap",
        "min",
        "raise the sampling temperature or make the frontier band easier",
    ),
    "mixed_min": (
        "frontier_mixed_share",
        "min",
        "raise the sampling temperature or the samples per problem",
    ),
}


def greedy_pass(rows: list[dict]) -> float:
    greedy = [row["correct"] for row in rows if row.get("decoding", "greedy") == "greedy"]
    if not greedy:
        raise ReasonRLError("calibration: no greedy trajectories")
    return float(np.mean(greedy))


def sampled_outcomes(rows: list[dict]) -> list[list[bool]]:
    """Correctness of each problem's sampled trajectories; every problem the same count."""
    by_problem: dict[str, list[bool]] = defaultdict(list)
    for row in rows:
        if row.get("decoding") == "sampled":
            by_problem[row["problem_id"]].append(bool(row["correct"]))
    counts = {len(outcomes) for outcomes in by_problem.values()}
    if len(counts) != 1:
        raise ReasonRLError(f"calibration: sampled trajectories per problem differ: {counts}")
    return list(by_problem.values())


def measure(easy: list[dict], frontier: list[dict], k: int) -> dict[str, float]:
    """The headroom measures from the start policy's trajectories on both bands."""
    outcomes = sampled_outcomes(frontier)
    n = len(outcomes[0])
    if not 1 <= k <= n:
        raise ReasonRLError(f"calibration: pass@{k} needs at least {k} samples, got {n}")
    frontier_greedy = greedy_pass(frontier)
    pass_k = float(np.mean([pass_at_k(n, sum(o), k) for o in outcomes]))
    return {
        "easy_greedy": greedy_pass(easy),
        "frontier_greedy": frontier_greedy,
        f"frontier_pass@{k}": pass_k,
        "frontier_pass_gap": pass_k - frontier_greedy,
        "frontier_sampled_pass@1": float(np.mean([np.mean(o) for o in outcomes])),
        "frontier_mixed_share": float(np.mean([0 < sum(o) < len(o) for o in outcomes])),
        "frontier_problems": len(outcomes),
        "samples_per_problem": n,
    }


def failed_gates(measures: dict[str, float], gates: dict[str, float]) -> list[str]:
    """One line per failed gate: which, the measured value, the bound and what to change."""
    failures = []
    for gate, bound in gates.items():
        name, kind, advice = GATES[gate]
        value = measures[name]
        if (kind == "min" and value < bound) or (kind == "max" and value > bound):
            relation = "at least" if kind == "min" else "at most"
            failures.append(
                f"calibration gate '{gate}' failed: {name} is {value:.3f}, needs {relation} "
                f"{bound}: {advice}"
            )
    return failures

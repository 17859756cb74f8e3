"""Best-of-N reranking: from n samples per problem, the expected correctness of the top-scored
sample of a random N-subset, computed exactly (the sample ranked r, 0-based, is the subset's
best with probability C(n-1-r, N-1) / C(n, N)), next to pass@N, maj@N and the reward-weighted
vote (vote-SCORER@N: the answer whose samples' scores sum highest) from the same samples. The
same per-problem values score a best-of-N arm of a declared comparison (search_arm_scores)
and draw the best-of-N curves over N = 1, 2, 4, ... (exact, so no subsampling noise; the
weighted vote is exact up to metrics.WEIGHTED_VOTE_SUBSETS subsets, every N of 16 samples,
and a seeded subset sample above). Also the compute-matched baseline's accuracy beside HGS
(hgs-matched:SELECTION arms) and Math-Shepherd's sample-then-filter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from reasonrl.config import VOTE_WEIGHTS, SearchArm
from reasonrl.errors import ReasonRLError
from reasonrl.io import read_jsonl
from reasonrl.rewards.steps import NEGATIVE
from reasonrl.stats.comparisons import greedy_correct
from reasonrl.stats.metrics import bootstrap_ci, maj_at_k, pass_at_k, weighted_maj_at_k
from reasonrl.tasks.grading import normalize_answer


def best_of_n_expected(scores: Sequence[float], correct: Sequence[bool], n_pick: int) -> float:
    """E[correct of the top-scored sample in a uniformly random subset of size n_pick].

    Equal scores are broken by sample order (earlier sample ranks higher).
    """
    n = len(scores)
    if not 1 <= n_pick <= n:
        raise ValueError(f"best-of-N needs 1 <= N <= n, got n={n}, N={n_pick}")
    order = sorted(range(n), key=lambda i: (-scores[i], i))
    total = math.comb(n, n_pick)
    return sum(
        math.comb(n - 1 - rank, n_pick - 1) / total
        for rank, i in enumerate(order)
        if correct[i] and n - 1 - rank >= n_pick - 1
    )


def problem_accuracy(group: dict[str, Any], method: str, n_pick: int, n: int) -> float:
    """One problem's expected correctness when `method` answers from a uniformly random
    n_pick-subset of its first n samples: "pass@1", "pass@N" (some sample correct: the
    oracle), "maj@N" (the plurality answer), "vote-SCORER@N" (the answer with the largest
    sum of that reward over its samples, ties as maj@N's) or "SCORER@N" (the top sample by
    that reward).

    group: "correct" (list of bool), "answers" (normalised final answers or None) and
    "scores" ({scorer: list of float}), one entry per sample in sample order.
    """
    correct = group["correct"][:n]
    if method == "pass@1":
        return pass_at_k(n, sum(correct), 1)
    if method == "pass@N":
        return pass_at_k(n, sum(correct), n_pick)
    if method == "maj@N":
        return maj_at_k(group["answers"][:n], correct, n_pick)
    scorer = method.removesuffix("@N")
    if scorer.startswith("vote-"):
        weights = group["scores"][scorer.removeprefix("vote-")][:n]
        return weighted_maj_at_k(group["answers"][:n], correct, weights, n_pick)
    return best_of_n_expected(group["scores"][scorer][:n], correct, n_pick)


def samples_per_problem(groups: Iterable[dict[str, Any]]) -> int:
    """The samples every problem has (the fewest of any): best-of-N draws its subsets from them."""
    return min(len(g["correct"]) for g in groups)


def best_of_n_metrics(
    groups: list[dict[str, Any]], ns: Sequence[int], scorers: Sequence[str]
) -> dict[str, Any]:
    """Per N: pass@1, pass@N, maj@N, vote-`scorer`@N (for the scorers in VOTE_WEIGHTS) and
    `scorer`@N means with bootstrap 95% CIs over problems.

    groups: one dict per problem, as problem_accuracy takes it.
    """
    n = samples_per_problem(groups)
    votes = [f"vote-{scorer}@N" for scorer in scorers if scorer in VOTE_WEIGHTS]
    methods = ["pass@1", "pass@N", "maj@N", *votes, *(f"{scorer}@N" for scorer in scorers)]
    table: dict[str, Any] = {"n_problems": len(groups), "n_samples": n, "rows": []}
    for n_pick in sorted(k for k in set(ns) if k <= n):
        for method in methods:
            array = np.array([problem_accuracy(g, method, n_pick, n) for g in groups])
            low, high = bootstrap_ci(array)
            table["rows"].append(
                {
                    "N": n_pick,
                    "method": method,
                    "accuracy": float(array.mean()),
                    "ci_low": low,
                    "ci_high": high,
                }
            )
    return table


def best_of_n_groups(samples: list[dict], scores: list[dict]) -> dict[str, dict[str, Any]]:
    """Problem id -> its group (as problem_accuracy takes it) from the best-of-N stage's
    samples.jsonl (trajectories) and scores.jsonl rows, samples in sample order."""
    scored = {(row["problem_id"], row["sample"]): row["scores"] for row in scores}
    groups: dict[str, dict[str, Any]] = {}
    for row in sorted(samples, key=lambda r: (r["problem_id"], r["sample"])):
        key = (row["problem_id"], row["sample"])
        if key not in scored:
            raise ReasonRLError(f"no reward-model scores of sample {row['sample']} of '{key[0]}'")
        group = groups.setdefault(key[0], {"correct": [], "answers": [], "scores": {}})
        group["correct"].append(bool(row["correct"]))
        answer = row["final_answer"]
        group["answers"].append(None if answer is None else normalize_answer(answer))
        for scorer, value in scored[key].items():
            group["scores"].setdefault(scorer, []).append(value)
    return groups


def search_arm_scores(arm: SearchArm, folder: str | Path) -> dict[str, float]:
    """Per test problem, a search arm's score from its stage's folder: the correctness of the
    HGS-PRM answer (hgs/trajectories.jsonl) or of the greedy decoding (best-of-n/greedy.jsonl),
    or for bon:SELECTION@N the best-of-N table's own per-problem value (problem_accuracy):
    0/1 at N = the samples drawn (a vote, weighted or not, tied between t answers scores
    1/t), the expectation over N-subsets below it; for hgs-matched:SELECTION the same value
    among all of a problem's compute-matched samples (hgs/matched.jsonl)."""
    folder = Path(folder)
    if arm.stage == "hgs" and arm.method != "hgs":
        return {
            pid: matched_accuracy([g], f"{arm.method}@N") for pid, g in read_matched(folder).items()
        }
    if arm.method == "hgs":
        rows = read_jsonl(folder / "trajectories.jsonl", schema="trajectory")
        return _one_per_problem(rows, folder / "trajectories.jsonl")
    if arm.method == "greedy":
        return greedy_correct(str(folder / "greedy.jsonl"))
    groups = read_best_of_n(folder)
    n = samples_per_problem(groups.values())
    if arm.n > n:
        raise ReasonRLError(f"{folder}: best-of-{arm.n} needs {arm.n} samples, there are {n}")
    method = f"{arm.method}@N"  # the table's name: pass@N, maj@N, vote-orm@N, prm-min@N, ...
    return {pid: problem_accuracy(g, method, arm.n, n) for pid, g in groups.items()}


def _one_per_problem(rows: list[dict], path: Path) -> dict[str, float]:
    scores = {row["problem_id"]: float(row["correct"]) for row in rows}
    if len(scores) != len(rows):
        raise ReasonRLError(f"{path}: more than one trajectory of a problem")
    return scores


def read_best_of_n(folder: str | Path) -> dict[str, dict[str, Any]]:
    """best_of_n_groups of the best-of-N stage's folder (samples.jsonl, scores.jsonl)."""
    folder = Path(folder)
    return best_of_n_groups(
        read_jsonl(folder / "samples.jsonl", schema="trajectory"),
        read_jsonl(folder / "scores.jsonl"),
    )


def read_matched(folder: str | Path) -> dict[str, dict[str, Any]]:
    """best_of_n_groups of the HGS stage's compute-matched samples (matched.jsonl,
    matched_scores.jsonl): a problem has as many samples as its HGS budget paid for."""
    folder = Path(folder)
    return best_of_n_groups(
        read_jsonl(folder / "matched.jsonl", schema="trajectory"),
        read_jsonl(folder / "matched_scores.jsonl"),
    )


def matched_accuracy(groups: Iterable[dict[str, Any]], method: str) -> float:
    """Mean over problems of `method` ("maj@N", "SCORER@N", ...) choosing among all of each
    problem's compute-matched samples."""
    return float(
        np.mean([problem_accuracy(g, method, len(g["correct"]), len(g["correct"])) for g in groups])
    )


def powers_of_two(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself: the N of a best-of-N curve."""
    return sorted({2**i for i in range(n.bit_length())} | {n})


def best_of_n_curve(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """best_of_n_metrics at N = 1, 2, 4, ... up to the samples drawn, for every reward model
    that scored them: the exact expectation over N-subsets of the samples, which averaging
    random subsamples only approximates (the weighted vote's too, up to
    metrics.WEIGHTED_VOTE_SUBSETS subsets: every N of 16 samples)."""
    scorers = sorted({scorer for g in groups for scorer in g["scores"]})
    return best_of_n_metrics(groups, powers_of_two(samples_per_problem(groups)), scorers)


def sample_then_filter(step_labels: list[list[list[str]]], correct: list[list[bool]]) -> dict:
    """Drop samples with any negative step; accuracy of what is left (pooled, as in the paper)
    and per problem (a problem with nothing left counts as unsolved)."""
    kept, kept_correct, per_problem = 0, 0, []
    for labels_of, right in zip(step_labels, correct, strict=True):
        keep = [NEGATIVE not in labels for labels in labels_of]
        k = sum(keep)
        c = sum(r for r, k_ in zip(right, keep, strict=True) if k_)
        kept, kept_correct = kept + k, kept_correct + c
        per_problem.append(c / k if k else 0.0)
    total = sum(map(len, correct))
    return {
        "samples": total,
        "kept": kept,
        "accuracy_before": sum(map(sum, correct)) / total if total else 0.0,
        "accuracy_after": kept_correct / kept if kept else 0.0,
        "accuracy_per_problem": float(np.mean(per_problem)) if per_problem else 0.0,
    }

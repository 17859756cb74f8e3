"""Evaluation metrics (the estimators and statistics; the stages are stages.evaluate): greedy
pass@1, unbiased pass@k and maj@k, a verifier-weighted maj@k, bootstrap CIs, and their
summary."""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np

from reasonrl.errors import ReasonRLError

BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
# A weighted vote enumerates all C(n, k) subsets up to this many (every k of 16 samples: at
# most C(16, 8) = 12870); above, it averages over this many random k-subsets, whose standard
# error is at most 0.5 / sqrt(20000) = 0.0035 per problem.
WEIGHTED_VOTE_SUBSETS = 20_000
WEIGHTED_VOTE_SEED = 0
# Two answers whose weight sums differ by float rounding only (the same scores added in
# another order) tie.
WEIGHTED_VOTE_TIE_RTOL = 1e-9


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    Computed as the product form of the Codex paper (Chen et al., 2021), which never
    builds the huge binomials.
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def maj_at_k(answers: list[str | None], correct: list[bool], k: int) -> float:
    """Unbiased maj@k from n >= k samples of one problem, computed exactly.

    The expectation, over all C(n, k) subsets of size k, of "the plurality answer of the
    subset is correct"; a tie between t answers counts each with weight 1/t, and None
    answers never win (a subset of only None scores 0). Equal strings are one answer; an
    answer's correctness is the fraction of its samples marked correct (0 or 1 whenever
    the grader is consistent).

    Instead of enumerating subsets, for every correct answer g and winning count m it
    counts the subsets where g is picked exactly m times, every other answer at most m
    times, and exactly t others exactly m times: a polynomial product over the answers
    (exact integers), so it costs O(k^3 * answers^2) at worst rather than C(n, k).
    """
    n = len(answers)
    if len(correct) != n:
        raise ValueError(f"maj@k got {n} answers but {len(correct)} correctness labels")
    if not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n, got n={n}, k={k}")
    sizes: Counter[str] = Counter()
    n_correct: Counter[str] = Counter()
    for answer, is_correct in zip(answers, correct, strict=True):
        if answer is not None:
            sizes[answer] += 1
            n_correct[answer] += bool(is_correct)
    n_none = n - sum(sizes.values())
    expected = Fraction(0)
    for answer, size in sizes.items():
        if n_correct[answer] == 0:
            continue
        others = [s for a, s in sizes.items() if a != answer]
        wins = sum(
            Fraction(math.comb(size, m) * count, ties + 1)
            for m in range(1, min(size, k) + 1)
            for ties, count in enumerate(_others_at_most(others, n_none, m, k - m))
        )
        expected += Fraction(n_correct[answer], size) * wins
    return float(expected / math.comb(n, k))


def weighted_maj_at_k(
    answers: Sequence[str | None],
    correct: Sequence[bool],
    weights: Sequence[float],
    k: int,
    max_subsets: int = WEIGHTED_VOTE_SUBSETS,
) -> float:
    """maj@k with each sample's vote weighted by a verifier's score of it (DIVERSE, Li et al.
    2023; Math-Shepherd's self-consistency + PRM): in a k-subset, the answer whose samples'
    weights sum highest wins. Otherwise as maj_at_k: a tie between t answers counts each
    with weight 1/t, None answers never win (a subset of only None scores 0), and an
    answer's correctness is the fraction of its samples marked correct.

    Weight sums are real numbers, so maj_at_k's counting does not carry over: the
    expectation is exact over all C(n, k) subsets when there are at most max_subsets of
    them, else the mean over max_subsets uniformly random k-subsets (a fixed seed: the same
    inputs always give the same value). Weights must be non-negative (probabilities such as
    a PRM's or ORM's P("+")): a negative one would count against its own answer.
    """
    n = len(answers)
    if len(correct) != n or len(weights) != n:
        raise ValueError(
            f"weighted maj@k got {n} answers, {len(correct)} correctness labels "
            f"and {len(weights)} weights"
        )
    if not 1 <= k <= n:
        raise ValueError(f"weighted maj@k needs 1 <= k <= n, got n={n}, k={k}")
    if min(weights) < 0:
        raise ValueError(f"weighted maj@k needs non-negative weights, got {min(weights)}")
    voted = sorted({answer for answer in answers if answer is not None})
    if not voted:
        return 0.0
    # members[i, j]: sample i voted answer j
    members = np.array([[answer == a for a in voted] for answer in answers], dtype=float)
    right = (np.asarray(correct, dtype=float) @ members) / members.sum(axis=0)
    subsets = _k_subsets(n, k, max_subsets)
    # one product gives each subset's votes and weight sums per answer
    votes, sums = np.hsplit(
        subsets @ np.hstack([members, members * np.asarray(weights, dtype=float)[:, None]]), 2
    )
    present = votes > 0
    best = np.where(present, sums, -np.inf).max(axis=1, keepdims=True)
    winners = present & np.isclose(sums, best, rtol=WEIGHTED_VOTE_TIE_RTOL, atol=0.0)
    n_winners = winners.sum(axis=1)
    wins = np.divide(winners @ right, n_winners, out=np.zeros(len(subsets)), where=n_winners > 0)
    return float(wins.mean())


@lru_cache(maxsize=8)
def _k_subsets(n: int, k: int, max_subsets: int) -> np.ndarray:
    """(subsets, n) membership rows, one per k-subset of n samples: all of them, or
    max_subsets uniformly random ones where there are more (the same ones for every problem
    and method of a curve)."""
    if math.comb(n, k) <= max_subsets:
        chosen = np.array(list(itertools.combinations(range(n), k)), dtype=np.intp)
    else:
        keys = np.random.default_rng(WEIGHTED_VOTE_SEED).random((max_subsets, n))
        chosen = np.argpartition(keys, k - 1, axis=1)[:, :k]
    rows = np.zeros((len(chosen), n))  # float, as the products with it need
    np.put_along_axis(rows, chosen, 1.0, axis=1)
    rows.setflags(write=False)
    return rows


def _others_at_most(others: list[int], n_none: int, m: int, picks: int) -> list[int]:
    """Ways to pick exactly `picks` samples from the None group (freely) and the other
    answers (each at most m times), indexed by how many other answers are picked m times.
    """
    # ways[j][t]: j samples picked so far, t answers among them picked exactly m times
    ways = [[math.comb(n_none, j)] + [0] * len(others) for j in range(picks + 1)]
    for size in others:
        new = [[0] * (len(others) + 1) for _ in range(picks + 1)]
        for j, row in enumerate(ways):
            for t, count in enumerate(row):
                if count == 0:
                    continue
                for i in range(min(size, m, picks - j) + 1):
                    new[j + i][t + (i == m)] += count * math.comb(size, i)
        ways = new
    return ways[picks]


def summarize(
    greedy: list[dict],
    sampled: list[dict],
    ks: list[int],
    normalize: Callable[[str], str] = lambda a: a,
) -> dict[str, Any]:
    """Metrics of one policy on one task from its trajectory rows.

    greedy: one temperature-0 trajectory per problem -> greedy_pass@1 with a bootstrap
    95% CI over problems, and the behaviour counts (turns, tokens, finish reasons, tool
    statuses), which describe the greedy runs. sampled: n trajectories per problem ->
    pass@k and maj@k (mean over problems) for every k in ks with k <= n; `normalize`
    maps final answers to the strings that maj@k votes on.
    """
    greedy_by_problem = _group_by_problem(greedy)
    duplicated = sorted(p for p, rows in greedy_by_problem.items() if len(rows) > 1)
    if duplicated:
        raise ReasonRLError(f"more than one greedy trajectory for problem '{duplicated[0]}'")
    if not greedy_by_problem:
        raise ReasonRLError("no greedy trajectories to evaluate")
    solved = np.array([float(rows[0]["correct"]) for rows in greedy_by_problem.values()])
    metrics: dict[str, Any] = {
        "n_problems": len(solved),
        "greedy_pass@1": float(solved.mean()),
        "greedy_pass@1_ci": bootstrap_ci(solved),
        "mean_turns": float(np.mean([row["num_turns"] for row in greedy])),
        "mean_tokens": float(np.mean([row["num_tokens"] for row in greedy])),
        "finish_reasons": dict(sorted(Counter(row["finish_reason"] for row in greedy).items())),
        "tool_status": dict(
            sorted(Counter(s for row in greedy for s in row["tool_status"]).items())
        ),
    }
    metrics.update(_sampled_metrics(_group_by_problem(sampled), ks, normalize))
    return metrics


def _sampled_metrics(
    by_problem: dict[str, list[dict]], ks: list[int], normalize: Callable[[str], str]
) -> dict[str, Any]:
    counts = {len(rows) for rows in by_problem.values()}
    if len(counts) > 1:
        raise ReasonRLError(f"sampled trajectories per problem differ: {sorted(counts)}")
    n = counts.pop() if counts else 0
    metrics: dict[str, Any] = {"n_samples": n}
    for k in sorted(k for k in set(ks) if k <= n):
        pass_k, maj_k = [], []
        for rows in by_problem.values():
            correct = [bool(row["correct"]) for row in rows]
            answers = [
                None if row["final_answer"] is None else normalize(row["final_answer"])
                for row in rows
            ]
            pass_k.append(pass_at_k(n, sum(correct), k))
            maj_k.append(maj_at_k(answers, correct, k))
        metrics[f"pass@{k}"] = float(np.mean(pass_k))
        metrics[f"maj@{k}"] = float(np.mean(maj_k))
    return metrics


def _group_by_problem(rows: list[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        grouped[row["problem_id"]].append(row)
    return dict(grouped)


def bootstrap_ci(values: np.ndarray, level: float = 0.95) -> list[float]:
    """Percentile bootstrap CI of the mean over problems (fixed seed, so reruns agree)."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    resamples = rng.integers(0, len(values), size=(BOOTSTRAP_RESAMPLES, len(values)))
    means = values[resamples].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return [float(low), float(high)]


def metrics_rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """Flat (metric, value) rows for the CSV: nested keys joined with '/'."""
    rows: list[dict[str, Any]] = []
    for key, value in metrics.items():
        if isinstance(value, dict):
            rows.extend(
                {"metric": f"{key}/{row['metric']}", "value": row["value"]}
                for row in metrics_rows(value)
            )
        elif isinstance(value, list):
            rows.extend({"metric": f"{key}/{i}", "value": item} for i, item in enumerate(value))
        else:
            rows.append({"metric": key, "value": value})
    return rows

"""Paired comparisons of two arms on the same test problems, pre-registered and Holm-corrected.

Both arms are scored per problem (0/1 correctness, or a real-valued score such as a reward),
aligned by problem id, and compared on the difference `a - b`:

- a paired percentile bootstrap 95% CI of the mean difference (problems resampled together, so
  the correlation between the arms narrows the interval, unlike two separate CIs);
- a p-value: the exact McNemar test (binomial on the discordant pairs, statsmodels) for 0/1
  scores, the Wilcoxon signed-rank test (scipy) for real-valued ones;
- with a non-inferiority margin m > 0 (a claim that a costs b at most m, e.g. a method's price
  on the band it was not trained for), the one-sided paired t-test of H0: mean(a - b) <= -m
  (scipy) instead: the large-sample test on the per-problem differences, which the exact
  McNemar test has no shifted form of;
- Holm's step-down correction over every comparison declared in the config (statsmodels);
- the exact power of McNemar's test at the observed discordance, which a null result reports
  beside its CI so a reader can tell "no effect" from "too few problems to see one".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests

from reasonrl.errors import ReasonRLError
from reasonrl.io import read_jsonl

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


def paired_scores(
    a: Mapping[str, float], b: Mapping[str, float], name: str
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The two arms' scores on their common problems, in one order; unequal sets are an error.

    A comparison is paired only when both arms saw the same problems: a missing problem means
    one arm was evaluated on another set, which would silently unpair the test.
    """
    only_a = sorted(set(a) - set(b))
    only_b = sorted(set(b) - set(a))
    if only_a or only_b:
        missing = only_a[:1] or only_b[:1]
        raise ReasonRLError(
            f"comparison '{name}': the arms were scored on different problems "
            f"({len(only_a)} only in a, {len(only_b)} only in b, e.g. '{missing[0]}')"
        )
    if not a:
        raise ReasonRLError(f"comparison '{name}': no problems to compare")
    ids = sorted(a)
    return ids, np.array([float(a[i]) for i in ids]), np.array([float(b[i]) for i in ids])


def paired_bootstrap_ci(
    a: np.ndarray, b: np.ndarray, level: float = 0.95, seed: int = BOOTSTRAP_SEED
) -> tuple[float, float]:
    """Percentile bootstrap CI of mean(a - b), resampling problems (fixed seed: reruns agree)."""
    diff = a - b
    rng = np.random.default_rng(seed)
    resamples = rng.integers(0, len(diff), size=(BOOTSTRAP_RESAMPLES, len(diff)))
    means = diff[resamples].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def is_binary(values: np.ndarray) -> bool:
    return bool(np.isin(values, (0.0, 1.0)).all())


def mcnemar_exact_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided exact McNemar p-value for paired 0/1 outcomes (1.0 with no discordant pair)."""
    a_only = int(((a == 1) & (b == 0)).sum())
    b_only = int(((a == 0) & (b == 1)).sum())
    both = int(((a == 1) & (b == 1)).sum())
    neither = int(((a == 0) & (b == 0)).sum())
    return float(mcnemar([[both, a_only], [b_only, neither]], exact=True).pvalue)


def signed_rank_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided Wilcoxon signed-rank p-value for paired real scores (1.0 when all equal)."""
    if np.allclose(a, b):
        return 1.0
    return float(stats.wilcoxon(a, b, zero_method="zsplit").pvalue)


def mcnemar_power(n: int, p_a_only: float, p_b_only: float, alpha: float = 0.05) -> float:
    """Exact power of the two-sided exact McNemar test at level alpha with n paired problems,
    where a problem is solved by arm a only with probability p_a_only and by b only with
    p_b_only: the sum over discordant counts d ~ Bin(n, p_a_only + p_b_only) of the chance
    that the a-only count, ~ Bin(d, share), lands in the test's rejection region.
    """
    discordant = p_a_only + p_b_only
    if n <= 0 or discordant <= 0:
        return 0.0
    share = p_a_only / discordant
    power = 0.0
    for d in range(1, n + 1):
        weight = stats.binom.pmf(d, n, discordant)
        if weight < 1e-12:
            continue
        counts = np.arange(d + 1)
        # The exact two-sided test at 1/2 is symmetric: twice the smaller tail, capped at 1.
        p_values = np.minimum(1.0, 2 * stats.binom.cdf(np.minimum(counts, d - counts), d, 0.5))
        power += weight * stats.binom.pmf(counts[p_values <= alpha], d, share).sum()
    return float(power)


def noninferiority_p(a: np.ndarray, b: np.ndarray, margin: float) -> float:
    """One-sided p of H0: mean(a - b) <= -margin, by the paired t-test on the differences."""
    diff = a - b
    if np.ptp(diff) == 0:  # no spread: the t statistic is undefined, the verdict is not
        return 0.0 if diff[0] > -margin else 1.0
    return float(stats.ttest_1samp(diff, -margin, alternative="greater").pvalue)


def compare(
    name: str,
    metric: str,
    a: str,
    b: str,
    scores_a: Mapping,
    scores_b: Mapping,
    margin: float = 0.0,
) -> dict:
    """One comparison row (before Holm): the arms' means, mean difference a - b, its paired
    bootstrap CI, the p-value of the matching paired test (of non-inferiority by `margin` when
    it is above 0), and McNemar's power at the observed discordance for 0/1 scores."""
    _, values_a, values_b = paired_scores(scores_a, scores_b, name)
    low, high = paired_bootstrap_ci(values_a, values_b)
    binary = is_binary(values_a) and is_binary(values_b)
    row: dict[str, Any] = {
        "name": name,
        "metric": metric,
        "a": a,
        "b": b,
        "n": len(values_a),
        "value_a": float(values_a.mean()),
        "value_b": float(values_b.mean()),
        "diff": float((values_a - values_b).mean()),
        "ci_low": low,
        "ci_high": high,
    }
    if margin > 0:
        row["margin"] = margin
        row["test"] = "noninferiority_paired_t"
        row["p"] = noninferiority_p(values_a, values_b, margin)
        return row
    row["test"] = "mcnemar_exact" if binary else "wilcoxon_signed_rank"
    row["p"] = mcnemar_exact_p(values_a, values_b) if binary else signed_rank_p(values_a, values_b)
    if binary:
        row["power"] = mcnemar_power(
            len(values_a),
            float(((values_a == 1) & (values_b == 0)).mean()),
            float(((values_a == 0) & (values_b == 1)).mean()),
        )
    return row


def holm(rows: Sequence[dict], alpha: float = 0.05) -> list[dict]:
    """The rows with `p_holm`: Holm's step-down adjustment over all of them at once."""
    if not rows:
        return []
    adjusted = multipletests([row["p"] for row in rows], alpha=alpha, method="holm")[1]
    return [{**row, "p_holm": float(p)} for row, p in zip(rows, adjusted, strict=True)]


def greedy_correct(path: str) -> dict[str, float]:
    """Per-problem greedy correctness (1.0 / 0.0) from an evaluation's trajectories.jsonl."""
    scores = {
        row["problem_id"]: float(row["correct"])
        for row in read_jsonl(path, schema="trajectory")
        if row.get("decoding", "greedy") == "greedy"
    }
    if not scores:
        raise ReasonRLError(f"{path}: no greedy trajectories to compare")
    return scores


SEARCH_METRIC = "accuracy"  # the metric of a comparison with a search arm: its answer's score


def run_declared(
    declared: Sequence[dict],
    arm_paths: Mapping[tuple[str, str], str],
    picked: Mapping[str, str],
    alpha: float,
    search_scores: Mapping[tuple[str, str], Mapping[str, float]] | None = None,
) -> list[dict]:
    """Every declared comparison, Holm-corrected together. arm_paths: (task, policy) -> the
    policy's test trajectories on that task (one policy may be compared on several tasks);
    picked: METHOD -> the policy its held-out selection chose (METHOD-best); search_scores:
    (task, search arm) -> its per-problem scores (reasonrl.search)."""
    search_scores = search_scores or {}

    def resolve(arm: str, task: str) -> tuple[str, str]:
        method = arm.removesuffix("-best")
        policy = picked[method] if arm.endswith("-best") else arm
        if (task, policy) not in arm_paths:
            raise ReasonRLError(
                f"comparison arm '{arm}': no test trajectories of '{policy}' on '{task}' given"
            )
        label = f"{arm} ({policy})" if policy != arm else arm
        return label, arm_paths[task, policy]

    rows = []
    for comparison in declared:
        task, arms = comparison["task"], (comparison["a"], comparison["b"])
        if all((task, arm) in search_scores for arm in arms):
            scores = same_problems(*(search_scores[task, arm] for arm in arms))
            labels, metric = arms, SEARCH_METRIC
        else:
            (label_a, path_a), (label_b, path_b) = (resolve(arm, task) for arm in arms)
            scores = greedy_correct(path_a), greedy_correct(path_b)
            labels, metric = (label_a, label_b), comparison["metric"]
        rows.append(
            compare(comparison["name"], metric, *labels, *scores, comparison.get("margin", 0.0))
        )
    return holm(rows, alpha)


def same_problems(
    a: Mapping[str, float], b: Mapping[str, float]
) -> tuple[Mapping[str, float], Mapping[str, float]]:
    """Two search arms on the problems of the smaller: each search stage runs on the first
    max_problems of the same test split, so one arm's problems include the other's (when
    they do not, compare's pairing check names a problem only one arm has)."""
    if set(a) < set(b):
        return a, {pid: b[pid] for pid in a}
    if set(b) < set(a):
        return {pid: a[pid] for pid in b}, b
    return a, b

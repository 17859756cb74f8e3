"""pass@k, maj@k and the weighted maj@k against brute force over subsets; summarize on
hand-made rows."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest

from reasonrl.errors import ReasonRLError
from reasonrl.stats.metrics import maj_at_k, metrics_rows, pass_at_k, summarize, weighted_maj_at_k


def brute_pass_at_k(correct: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(correct, k))
    return sum(any(s) for s in subsets) / len(subsets)


def brute_maj_at_k(answers: list[str | None], correct: list[bool], k: int) -> float:
    """Mean over all size-k subsets of the tie-split chance that the plurality is correct."""
    is_right = {a: c for a, c in zip(answers, correct, strict=True) if a is not None}
    total = 0.0
    subsets = list(itertools.combinations(range(len(answers)), k))
    for subset in subsets:
        votes = Counter(answers[i] for i in subset if answers[i] is not None)
        if not votes:
            continue
        top = max(votes.values())
        winners = [a for a, v in votes.items() if v == top]
        total += sum(is_right[a] for a in winners) / len(winners)
    return total / len(subsets)


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        correct = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(correct, k), abs=1e-12)


def test_pass_at_k_large_n_is_finite_and_matches_the_binomial_formula():
    n, c, k = 200, 7, 50
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize("n, c, k", [(3, 1, 4), (3, 4, 1), (3, 1, 0)])
def test_pass_at_k_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


# (answers, correct): a tie-rich plurality, None answers, a single correct voter, all None
MAJ_CASES = [
    (["4", "4", "5", "5", "6", None], [True, True, False, False, False, False]),
    (["a", "b", "b", "a", "c", "c", "a"], [True, False, False, True, False, False, True]),
    ([None, None, "7", "8", "8"], [False, False, True, False, False]),
    (["1", "2", "3", "4", "1"], [False, True, False, False, False]),
    ([None, None, None], [False, False, False]),
    (
        ["x", "y", "x", "y", "z", "z", "x", "w"],
        [False, True, False, True, False, False, False, False],
    ),
]


@pytest.mark.parametrize("answers, correct", MAJ_CASES)
def test_maj_at_k_matches_enumeration_of_subsets(answers, correct):
    for k in range(1, len(answers) + 1):
        assert maj_at_k(answers, correct, k) == pytest.approx(
            brute_maj_at_k(answers, correct, k), abs=1e-12
        )


def test_maj_at_k_matches_enumeration_on_random_cases():
    rng = random.Random(1)
    for _ in range(40):
        n = rng.randint(1, 9)
        answers = [rng.choice(["a", "b", "c", "d", None]) for _ in range(n)]
        gold = rng.choice(["a", "b"])
        correct = [a == gold for a in answers]
        k = rng.randint(1, n)
        assert maj_at_k(answers, correct, k) == pytest.approx(
            brute_maj_at_k(answers, correct, k), abs=1e-12
        )


def test_maj_at_1_is_the_fraction_correct():
    answers = ["3", "3", "4", None, "3", "5"]
    correct = [True, True, False, False, True, False]
    assert maj_at_k(answers, correct, 1) == pytest.approx(3 / 6)


def test_maj_at_n_is_the_plurality_of_all_samples():
    assert maj_at_k(["3", "4", "4", None, None, None], [True, False, False] + [False] * 3, 6) == 0.0
    assert maj_at_k(["3", "3", "4", None, None, None], [True, True, False] + [False] * 3, 6) == 1.0
    # a two-way tie over all samples splits the vote
    assert maj_at_k(["3", "4"], [True, False], 2) == pytest.approx(0.5)


def test_maj_at_k_is_exact_and_fast_for_many_samples():
    # 64 samples: enumeration (C(64, 32) subsets) is impossible; the value is 1/2 by symmetry
    answers = ["right"] * 30 + ["wrong"] * 30 + [None] * 4
    correct = [True] * 30 + [False] * 34
    assert maj_at_k(answers, correct, 32) == pytest.approx(0.5, abs=1e-12)


def test_maj_at_k_rejects_k_above_n_and_mismatched_lengths():
    with pytest.raises(ValueError):
        maj_at_k(["1", "2"], [True, False], 3)
    with pytest.raises(ValueError):
        maj_at_k(["1", "2"], [True], 1)


def brute_weighted_maj_at_k(answers, correct, weights, k) -> float:
    """Mean over all size-k subsets of the tie-split chance that the answer with the largest
    weight sum is correct."""
    is_right = {a: c for a, c in zip(answers, correct, strict=True) if a is not None}
    total = 0.0
    subsets = list(itertools.combinations(range(len(answers)), k))
    for subset in subsets:
        sums = Counter()
        for i in subset:
            if answers[i] is not None:
                sums[answers[i]] += weights[i]
        if not sums:
            continue
        top = max(sums.values())
        winners = [a for a, v in sums.items() if v == top]
        total += sum(is_right[a] for a in winners) / len(winners)
    return total / len(subsets)


def test_weighted_maj_at_k_matches_enumeration_on_random_cases():
    rng = random.Random(2)
    for _ in range(60):
        n = rng.randint(1, 9)
        answers = [rng.choice(["a", "b", "c", None]) for _ in range(n)]
        correct = [a == "a" for a in answers]
        # quarters sum without rounding, so ties are exact; a zero weight still votes
        weights = [rng.choice([0.0, 0.25, 0.5, 1.0, rng.random()]) for _ in range(n)]
        k = rng.randint(1, n)
        assert weighted_maj_at_k(answers, correct, weights, k) == pytest.approx(
            brute_weighted_maj_at_k(answers, correct, weights, k), abs=1e-12
        )


@pytest.mark.parametrize("answers, correct", MAJ_CASES)
def test_weighted_maj_at_k_with_equal_weights_is_maj_at_k(answers, correct):
    for k in range(1, len(answers) + 1):
        assert weighted_maj_at_k(answers, correct, [0.5] * len(answers), k) == pytest.approx(
            maj_at_k(answers, correct, k), abs=1e-12
        )


def test_weighted_vote_follows_the_weights_where_the_count_disagrees():
    # three low-scored samples say 7, two high-scored ones say 9 (right): the plurality is 7,
    # the weighted vote 9 (0.9 + 0.9 > 3 x 0.1)
    answers, correct = ["7", "7", "7", "9", "9"], [False, False, False, True, True]
    assert weighted_maj_at_k(answers, correct, [0.1, 0.1, 0.1, 0.9, 0.9], 5) == 1.0
    assert maj_at_k(answers, correct, 5) == 0.0
    # the same votes scored alike: the weighted vote agrees with the plurality
    assert weighted_maj_at_k(answers, correct, [0.6, 0.5, 0.7, 0.6, 0.5], 5) == 0.0


def test_weighted_maj_at_k_ties_split_and_only_none_scores_zero():
    assert weighted_maj_at_k(["3", "4"], [True, False], [0.5, 0.5], 2) == pytest.approx(0.5)
    # 0.1 + 0.2 and 0.3 differ by float rounding only: still a tie
    assert weighted_maj_at_k(["3", "3", "4"], [True, True, False], [0.1, 0.2, 0.3], 3) == 0.5
    assert weighted_maj_at_k([None, None], [False, False], [0.9, 0.9], 1) == 0.0


def test_weighted_maj_at_k_samples_subsets_beyond_its_enumeration_budget():
    rng = random.Random(3)
    answers = [rng.choice(["a", "b", "c", None]) for _ in range(14)]
    correct = [a == "a" for a in answers]
    weights = [rng.random() for _ in answers]
    exact = weighted_maj_at_k(answers, correct, weights, 7)  # C(14, 7) = 3432 subsets
    sampled = weighted_maj_at_k(answers, correct, weights, 7, max_subsets=2000)
    assert sampled != exact  # an estimate from 2000 random subsets, standard error <= 0.011
    assert sampled == pytest.approx(exact, abs=0.04)
    assert weighted_maj_at_k(answers, correct, weights, 7, max_subsets=2000) == sampled


def test_weighted_maj_at_k_rejects_negative_weights_and_mismatched_lengths():
    with pytest.raises(ValueError, match="non-negative weights"):
        weighted_maj_at_k(["1", "2"], [True, False], [0.5, -0.1], 1)
    with pytest.raises(ValueError):
        weighted_maj_at_k(["1", "2"], [True, False], [0.5], 1)
    with pytest.raises(ValueError):
        weighted_maj_at_k(["1", "2"], [True, False], [0.5, 0.5], 3)


def trajectory(
    problem_id, correct, answer, sample=0, turns=2, tokens=10, finish="answer", tools=("ok",)
):
    return {
        "problem_id": problem_id,
        "task": "arith",
        "sample": sample,
        "messages": [],
        "final_answer": answer,
        "correct": correct,
        "finish_reason": finish,
        "num_turns": turns,
        "num_tokens": tokens,
        "tool_status": list(tools),
    }


def hand_made_rows():
    greedy = [
        trajectory("p1", True, "5", turns=2, tokens=10),
        trajectory(
            "p2", False, None, turns=6, tokens=30, finish="max_turns", tools=("error", "ok")
        ),
        trajectory("p3", True, "7", turns=1, tokens=20, tools=()),
        trajectory("p4", False, "1", turns=3, tokens=40, tools=("timeout",)),
    ]
    # p1: 2 of 3 correct (" 5" normalises to "5"); p2: 0 of 3
    sampled = [
        trajectory("p1", True, "5", sample=0),
        trajectory("p1", True, " 5", sample=1),
        trajectory("p1", False, "6", sample=2),
        trajectory("p2", False, "1", sample=0),
        trajectory("p2", False, None, sample=1),
        trajectory("p2", False, "2", sample=2),
    ]
    return greedy, sampled


def test_summarize_on_hand_made_rows():
    greedy, sampled = hand_made_rows()
    metrics = summarize(greedy, sampled, ks=[1, 3, 2, 8], normalize=str.strip)
    assert metrics["n_problems"] == 4
    assert metrics["n_samples"] == 3
    assert metrics["greedy_pass@1"] == 0.5
    assert metrics["mean_turns"] == 3.0
    assert metrics["mean_tokens"] == 25.0
    assert metrics["finish_reasons"] == {"answer": 3, "max_turns": 1}
    assert metrics["tool_status"] == {"error": 1, "ok": 2, "timeout": 1}
    assert metrics["pass@1"] == pytest.approx((2 / 3 + 0) / 2)
    assert metrics["pass@2"] == pytest.approx((1 + 0) / 2)
    assert metrics["pass@3"] == pytest.approx((1 + 0) / 2)
    # p1 with normalised answers: maj@3 = 1 (5,5,6); without normalising it is a 3-way tie
    assert metrics["maj@3"] == pytest.approx(0.5)
    assert summarize(greedy, sampled, ks=[3])["maj@3"] == pytest.approx((2 / 3) / 2)
    assert metrics["maj@1"] == pytest.approx(metrics["pass@1"])
    assert "pass@8" not in metrics and "maj@8" not in metrics


def test_summarize_bootstrap_ci_brackets_the_mean_and_is_reproducible():
    greedy = [trajectory(f"p{i}", i % 3 == 0, "1") for i in range(30)]
    metrics = summarize(greedy, [], ks=[1])
    low, high = metrics["greedy_pass@1_ci"]
    assert low < metrics["greedy_pass@1"] < high
    assert low >= 0.0 and high <= 1.0
    assert summarize(greedy, [], ks=[1])["greedy_pass@1_ci"] == [low, high]
    assert metrics["n_samples"] == 0 and "pass@1" not in metrics


def test_summarize_all_correct_has_a_degenerate_ci():
    greedy = [trajectory(f"p{i}", True, "1") for i in range(5)]
    assert summarize(greedy, [], ks=[1])["greedy_pass@1_ci"] == [1.0, 1.0]


def test_summarize_rejects_bad_inputs():
    greedy, sampled = hand_made_rows()
    with pytest.raises(ReasonRLError, match="p1"):
        summarize(greedy + [greedy[0]], sampled, ks=[1])
    with pytest.raises(ReasonRLError, match="no greedy"):
        summarize([], sampled, ks=[1])
    with pytest.raises(ReasonRLError, match="differ"):
        summarize(greedy, sampled[:-1], ks=[1])


def test_metrics_rows_flattens_nested_values():
    greedy, sampled = hand_made_rows()
    metrics = summarize(greedy, sampled, ks=[1])
    rows = {row["metric"]: row["value"] for row in metrics_rows(metrics)}
    assert rows["greedy_pass@1"] == 0.5
    assert rows["greedy_pass@1_ci/0"] == metrics["greedy_pass@1_ci"][0]
    assert rows["greedy_pass@1_ci/1"] == metrics["greedy_pass@1_ci"][1]
    assert rows["finish_reasons/max_turns"] == 1
    assert rows["tool_status/ok"] == 2
    assert rows["pass@1"] == metrics["pass@1"]
    assert all(set(row) == {"metric", "value"} for row in metrics_rows(metrics))

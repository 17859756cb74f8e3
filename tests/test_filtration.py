"""PF-PPO filters: empirical selection frequencies match each strategy's weights; R^2 over
reward bins matches a direct least-squares fit."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from reasonrl.errors import ReasonRLError
from reasonrl.ppo.filtration import (
    FilterSpec,
    r_squared,
    rank_weights,
    reward_bins,
    scale_rewards,
    select,
    selection_probabilities,
)

PROMPTS = 4000


def _groups(n: int = 5, seed: int = 0) -> list[list[float]]:
    rng = random.Random(seed)
    return [[rng.gauss(0, 1) for _ in range(n)] for _ in range(PROMPTS)]


def test_rank_weight_vectors_are_the_papers():
    assert rank_weights("bon", 5) == [1, 0, 0, 0, 0]
    assert rank_weights("br", 5) == [0.5, 0.125, 0.125, 0.125, 0.125]
    assert rank_weights("bw", 5) == [0.5, 0, 0, 0, 0.5]


@pytest.mark.parametrize("name", ["bon", "br", "bw"])
def test_rank_filters_draw_ranks_with_their_weights(name):
    groups = _groups()
    chosen = select(FilterSpec(name, draws=2), groups, random.Random(1))
    assert len(chosen) == 2 * PROMPTS
    ranks = Counter()
    for p, i in chosen:
        ranks[sorted(groups[p], reverse=True).index(groups[p][i])] += 1
    frequencies = [ranks[r] / len(chosen) for r in range(5)]
    assert frequencies == pytest.approx(rank_weights(name, 5), abs=0.015)


@pytest.mark.parametrize(
    ("name", "expected"),
    [("top", (1.0, 0.0, 0.0)), ("top-random", (1.0, 0.5, 0.5)), ("top-bottom", (1.0, 0.0, 1.0))],
)
def test_threshold_filters_keep_with_their_probabilities(name, expected):
    groups = _groups()
    spec = FilterSpec(name, top=0.3, bottom=-0.3)
    kept = Counter(select(spec, groups, random.Random(2)))
    flat = scale_rewards([r for g in groups for r in g])
    tallies = {"top": [0, 0], "middle": [0, 0], "bottom": [0, 0]}
    for p, group in enumerate(groups):
        for i in range(len(group)):
            r = flat[p * 5 + i]
            region = "top" if r >= 0.3 else "bottom" if r <= -0.3 else "middle"
            tallies[region][0] += kept[(p, i)]
            tallies[region][1] += 1
    observed = tuple(tallies[k][0] / tallies[k][1] for k in ("top", "middle", "bottom"))
    assert observed == pytest.approx(expected, abs=0.03)


@pytest.mark.parametrize("k", [1, 2])
def test_pow_k_draws_in_proportion_to_abs_reward_power(k):
    groups = [[-1.0, -0.5, 0.0, 0.5, 1.0]] * PROMPTS  # scaled rewards are these values
    chosen = select(FilterSpec("pow", draws=2, k=k), groups, random.Random(3))
    counts = Counter(i for _, i in chosen)
    weights = np.abs(np.array([-1.0, -0.5, 0.0, 0.5, 1.0])) ** k
    expected = weights / weights.sum()
    assert [counts[i] / len(chosen) for i in range(5)] == pytest.approx(expected, abs=0.015)


def test_ppo_m_keeps_everything():
    groups = _groups()[:10]
    assert len(select(FilterSpec("ppo-m"), groups, random.Random(0))) == 50


def test_unknown_filter_is_an_error():
    with pytest.raises(ReasonRLError, match="unknown filter"):
        FilterSpec("best-of-all")


def test_reward_bins_weighted_means_by_hand():
    edges = np.array([0.0, 1.0, 2.0, 3.0])
    bins = reward_bins([0.5, 0.7, 2.5, 1.5], [1, 0, 1, 0], [1.0, 3.0, 2.0, 0.0], edges)
    # bin 0: rewards 0.5 (w 1), 0.7 (w 3) -> mean 0.65, score 0.25; bin 1 has weight 0
    assert [b["bin"] for b in bins] == [0, 2]
    assert bins[0]["reward"] == pytest.approx(0.65)
    assert bins[0]["score"] == pytest.approx(0.25)
    assert bins[1]["score"] == 1.0


def test_r_squared_matches_lstsq():
    rng = np.random.default_rng(0)
    x = rng.normal(size=12)
    y = 0.7 * x + rng.normal(scale=0.5, size=12)
    design = np.stack([np.ones_like(x), x], axis=1)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    expected = 1 - ((y - design @ coef) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    assert r_squared(x, y) == pytest.approx(expected, rel=1e-10)
    assert 0 < expected < 1


def test_r_squared_undefined_without_variance():
    assert r_squared([1, 2, 3], [0.5, 0.5, 0.5]) is None
    assert r_squared([1, 2], [0, 1]) is None


def test_selection_probabilities_of_rank_filters_follow_ranking():
    probs = selection_probabilities(FilterSpec("bw"), [[0.1, 0.9, -0.4]])
    assert probs == [[0.0, 0.5, 0.5]]


def test_config_rejects_repeated_ppo_variant():
    from reasonrl.config import validate_config

    variants = [{"name": "br", "filter": "br"}, {"name": "br", "filter": "bw"}]
    with pytest.raises(ReasonRLError, match="'ppo.variants' repeats 'br'"):
        validate_config({"ppo": {"variants": variants}}, "my.yaml")

"""Policy filtration (PF-PPO) and its strategy-selection metric, R^2 over reward bins.

Per prompt, N responses are ranked by reward (y_1 best). A strategy says how likely each
response is to enter the PPO buffer:

- rank-based (PF-PPO, the paper's Section 4): `draws` categorical draws per prompt with
  weights BoN (1, 0, ..., 0), BR (1/2, 1/(2(N-1)), ...), BW (1/2, 0, ..., 0, 1/2);
- threshold (Section 5.4): on rewards min-max scaled to [-1, 1] over the iteration's
  responses, top keeps r >= top; top-random also keeps each other response with probability
  1/2; top-bottom keeps r >= top and r <= bottom;
- reweighting pow-k: `draws` x prompts draws from the whole buffer with weights |r|^k on the
  scaled rewards (the paper's reward model returns rewards in [-1, 1]; a BT-RM does not);
- baselines: PPO-M keeps all N; PPO-S samples one response per prompt (5x the prompts).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from reasonrl.errors import ReasonRLError

RANK = ("bon", "br", "bw")
THRESHOLD = ("top", "top-random", "top-bottom")
FILTERS = ("ppo-s", "ppo-m", *RANK, *THRESHOLD, "pow")


@dataclass(frozen=True)
class FilterSpec:
    name: str
    draws: int = 2  # rank-based and pow-k: buffer rows per prompt
    k: float = 1.0  # pow-k exponent
    top: float = 0.5  # threshold variants, on rewards scaled to [-1, 1]
    bottom: float = -0.5

    def __post_init__(self):
        if self.name not in FILTERS:
            raise ReasonRLError(f"unknown filter {self.name!r} (expected one of {FILTERS})")


def rank_weights(name: str, n: int) -> list[float]:
    """The paper's weight vector over ranks 1..n (best first)."""
    if name == "bon" or n == 1:
        return [1.0] + [0.0] * (n - 1)
    if name == "br":
        return [0.5] + [0.5 / (n - 1)] * (n - 1)
    if name == "bw":
        return [0.5] + [0.0] * (n - 2) + [0.5]
    raise ReasonRLError(f"{name!r} is not a rank-based filter (expected one of {RANK})")


def scale_rewards(rewards: Sequence[float]) -> list[float]:
    """Min-max scaling to [-1, 1] (all 0 when every reward is equal)."""
    low, high = min(rewards), max(rewards)
    if high == low:
        return [0.0] * len(rewards)
    return [2 * (r - low) / (high - low) - 1 for r in rewards]


def keep_probability(name: str, scaled: float, top: float, bottom: float) -> float:
    """Threshold variants: the probability that a response with scaled reward r is kept."""
    if scaled >= top:
        return 1.0
    if name == "top":
        return 0.0
    if name == "top-random":
        return 0.5
    if name == "top-bottom":
        return 1.0 if scaled <= bottom else 0.0
    raise ReasonRLError(f"{name!r} is not a threshold filter (expected one of {THRESHOLD})")


def ranking(rewards: Sequence[float]) -> list[int]:
    """Indices from the best reward to the worst (ties: earlier sample first)."""
    return sorted(range(len(rewards)), key=lambda i: (-rewards[i], i))


def selection_probabilities(spec: FilterSpec, groups: Sequence[Sequence[float]]) -> list[list]:
    """Per prompt and response, its expected share of one draw (rank, pow-k: the categorical
    weight) or its keep probability (threshold, PPO-S/M): the filtered policy's weights."""
    if spec.name in ("ppo-s", "ppo-m"):
        return [[1.0] * len(g) for g in groups]
    if spec.name in RANK:
        out = []
        for group in groups:
            weights = rank_weights(spec.name, len(group))
            probs = [0.0] * len(group)
            for rank, i in enumerate(ranking(group)):
                probs[i] = weights[rank]
            out.append(probs)
        return out
    scaled = _scaled_groups(groups)
    if spec.name in THRESHOLD:
        return [[keep_probability(spec.name, r, spec.top, spec.bottom) for r in g] for g in scaled]
    weights = [[abs(r) ** spec.k for r in g] for g in scaled]
    total = sum(map(sum, weights))
    if total == 0:
        return [[1.0 / sum(map(len, groups))] * len(g) for g in groups]
    return [[w / total for w in g] for g in weights]


def select(spec: FilterSpec, groups: Sequence[Sequence[float]], rng: random.Random) -> list:
    """(prompt, response) index pairs that enter the buffer, with repeats for repeated draws."""
    probs = selection_probabilities(spec, groups)
    chosen: list[tuple[int, int]] = []
    if spec.name in RANK:
        for p, weights in enumerate(probs):
            picks = rng.choices(range(len(weights)), weights=weights, k=spec.draws)
            chosen += [(p, i) for i in picks]
    elif spec.name == "pow":
        cells = [(p, i) for p, g in enumerate(probs) for i in range(len(g))]
        flat = [w for g in probs for w in g]
        chosen = rng.choices(cells, weights=flat, k=spec.draws * len(groups))
    else:
        for p, keeps in enumerate(probs):
            chosen += [(p, i) for i, keep in enumerate(keeps) if rng.random() < keep]
    return chosen


def _scaled_groups(groups: Sequence[Sequence[float]]) -> list[list[float]]:
    flat = scale_rewards([r for g in groups for r in g])
    out, start = [], 0
    for group in groups:
        out.append(flat[start : start + len(group)])
        start += len(group)
    return out


def reward_bins(
    rewards: Sequence[float], scores: Sequence[float], weights: Sequence[float], edges
) -> list[dict]:
    """Per non-empty reward bin: weighted mean reward, mean true score and total weight."""
    rewards, scores, weights = map(np.asarray, (rewards, scores, weights))
    which = np.clip(np.digitize(rewards, edges[1:-1]), 0, len(edges) - 2)
    rows = []
    for b in range(len(edges) - 1):
        w = weights * (which == b)
        if w.sum() > 0:
            rows.append(
                {
                    "bin": b,
                    "low": float(edges[b]),
                    "high": float(edges[b + 1]),
                    "reward": float((w * rewards).sum() / w.sum()),
                    "score": float((w * scores).sum() / w.sum()),
                    "weight": float(w.sum()),
                }
            )
    return rows


def r_squared(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Coefficient of determination of the least-squares line y ~ a + b x (None when y is
    constant or there are fewer than 3 points: no variance left to explain)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 3 or np.allclose(y, y.mean()):
        return None
    slope, intercept = np.polyfit(x, y, 1)
    residual = ((y - (intercept + slope * x)) ** 2).sum()
    return float(1 - residual / ((y - y.mean()) ** 2).sum())

"""Search with reward models: best-of-N reranking and HGS-PRM decoding.

Best-of-N: from n samples per problem, the expected correctness of the top-scored sample of
a random N-subset, computed exactly (the sample ranked r, 0-based, is the subset's best with
probability C(n-1-r, N-1) / C(n, N)), next to pass@N and maj@N from the same samples.

HGS-PRM (step-level reward model paper, Appendix A): expand one step, score it with the
PRM; accept a positive step and go on from it; otherwise keep sampling siblings until the
node has `max_bandwidth` children; then take a neutral child if there is one, else
backtrack to the parent (the node's own step counts as a negative child there). Total
expansions are capped at `max_iterations`; a capped (or exhausted) search answers by
completing its current state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reasonrl.metrics import bootstrap_ci, maj_at_k, pass_at_k
from reasonrl.rewards.steps import NEGATIVE, NEUTRAL, POSITIVE


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


def best_of_n_metrics(
    groups: list[dict[str, Any]], ns: Sequence[int], scorers: Sequence[str]
) -> dict[str, Any]:
    """Per N: pass@1, pass@N, maj@N and `scorer`@N means with bootstrap 95% CIs over problems.

    groups: one dict per problem with "correct" (list of bool), "answers" (normalised final
    answers or None) and "scores" ({scorer: list of float}).
    """
    n = min(len(g["correct"]) for g in groups)
    table: dict[str, Any] = {"n_problems": len(groups), "n_samples": n, "rows": []}
    for n_pick in sorted(k for k in set(ns) if k <= n):
        values: dict[str, list[float]] = {"pass@1": [], "pass@N": [], "maj@N": []}
        for scorer in scorers:
            values[f"{scorer}@N"] = []
        for g in groups:
            correct = g["correct"][:n]
            values["pass@1"].append(pass_at_k(n, sum(correct), 1))
            values["pass@N"].append(pass_at_k(n, sum(correct), n_pick))
            values["maj@N"].append(maj_at_k(g["answers"][:n], correct, n_pick))
            for scorer in scorers:
                values[f"{scorer}@N"].append(
                    best_of_n_expected(g["scores"][scorer][:n], correct, n_pick)
                )
        for method, per_problem in values.items():
            array = np.array(per_problem, dtype=float)
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


@dataclass
class _Frame:
    step: Any  # the accepted step that leads here (None at the root)
    tried: int = 0
    neutrals: list = field(default_factory=list)


class HGSSearch:
    """The search state of one problem; a driver feeds it one scored expansion at a time.

    `path()` is the accepted steps so far; `receive(step, label, final)` takes the PRM's label
    ("+", "~" or "-") of one new child of the current node. `events` records every decision
    (for tests and logs).
    """

    def __init__(self, max_bandwidth: int, max_iterations: int):
        self.max_bandwidth, self.max_iterations = max_bandwidth, max_iterations
        self.stack = [_Frame(None)]
        self.iterations = 0
        self.finished: str | None = None  # "answer", "cap" or "exhausted"
        self.events: list[tuple] = []

    def path(self) -> list:
        return [frame.step for frame in self.stack[1:]]

    @property
    def live(self) -> bool:
        return self.finished is None

    def receive(self, step: Any, label: str, final: bool) -> None:
        frame = self.stack[-1]
        frame.tried += 1
        self.iterations += 1
        if label == POSITIVE:
            self.events.append(("accept", step))
            self._enter(step, final)
        elif label == NEUTRAL:
            self.events.append(("neutral", step))
            frame.neutrals.append((step, final))
        else:
            self.events.append(("reject", step))
        if self.live and label != POSITIVE and frame.tried >= self.max_bandwidth:
            self._settle()
        if self.live and self.iterations >= self.max_iterations:
            self.events.append(("cap",))
            self.finished = "cap"

    def _enter(self, step: Any, final: bool) -> None:
        self.stack.append(_Frame(step))
        if final:
            self.finished = "answer"

    def _settle(self) -> None:
        """The current node is full: take a neutral child, else backtrack (maybe repeatedly)."""
        while self.live:
            frame = self.stack[-1]
            if frame.tried < self.max_bandwidth:
                return
            if frame.neutrals:
                step, final = frame.neutrals.pop(0)
                self.events.append(("take-neutral", step))
                self._enter(step, final)
                return
            if len(self.stack) == 1:
                self.events.append(("exhausted",))
                self.finished = "exhausted"
                return
            self.stack.pop()
            self.events.append(("backtrack", frame.step))


Expander = Callable[[list[int], list[list], int], list[tuple[Any, bool]]]
Labeler = Callable[[list[int], list[list], list[Any]], list[str]]


def run_hgs(
    n_problems: int,
    expand: Expander,
    label: Labeler,
    max_bandwidth: int,
    max_iterations: int,
) -> list[HGSSearch]:
    """Run one HGS-PRM search per problem in lockstep: each round, every live search asks for
    one child of its current node, so the model and the PRM see one batch per round.

    expand(problem indices, paths, round) -> [(step, final)] one sampled child per path (the
    model); label(problem indices, paths, steps) -> ["+", "~" or "-"] per child (the PRM).
    """
    searches = [HGSSearch(max_bandwidth, max_iterations) for _ in range(n_problems)]
    round_no = 0
    while live := [s for s in searches if s.live]:
        ids = [i for i, s in enumerate(searches) if s.live]
        paths = [s.path() for s in live]
        children = expand(ids, paths, round_no)
        labels = label(ids, paths, [step for step, _ in children])
        for search, (step, final), verdict in zip(live, children, labels, strict=True):
            search.receive(step, verdict, final)
        round_no += 1
    return searches

"""HGS-PRM decoding (step-level reward model paper, Appendix A): expand one step, score it with
the PRM; accept a positive step and go on from it; otherwise keep sampling siblings until the
node has `max_bandwidth` children; then take a neutral child if there is one, else backtrack
to the parent (the node's own step counts as a negative child there). Total expansions are
capped at `max_iterations`; a capped (or exhausted) search answers by completing its current
state.

Compute-matched sampling (the HGS stage's baseline): per problem, independent full samples at
HGS's temperature until that problem's HGS budget of policy calls (model turns) is spent,
answered by the same majority vote and PRM pick as best-of-N (search.best_of_n).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from reasonrl.errors import ReasonRLError
from reasonrl.rewards.steps import NEUTRAL, POSITIVE


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


# sample(problem indices, calls left per problem, round) -> one full sample per problem, made
# with at most that many model calls (its "num_turns").
Sampler = Callable[[list[int], list[int], int], list[dict]]


def sample_to_budget(budgets: Sequence[int], sample: Sampler) -> list[list[dict]]:
    """Independent full samples per problem until its call budget is spent, in lockstep rounds
    (one batch per round); a sample is capped at the calls its problem has left, so each
    problem spends exactly its budget. Rows get "sample" = their order within the problem."""
    left, made = list(budgets), [[] for _ in budgets]
    round_no = 0
    while ids := [i for i, calls in enumerate(left) if calls > 0]:
        rows = sample(ids, [left[i] for i in ids], round_no)
        for i, row in zip(ids, rows, strict=True):
            if not 1 <= row["num_turns"] <= left[i]:
                raise ReasonRLError(
                    f"a matched sample of problem {i} made {row['num_turns']} calls, "
                    f"with {left[i]} left"
                )
            left[i] -= row["num_turns"]
            made[i].append({**row, "sample": len(made[i])})
        round_no += 1
    return made

"""Math-Shepherd step labels: roll out K completions from every step prefix of a solution.

A step is labelled "+" (hard label) when at least one of its K completions reaches the gold
answer, "-" otherwise; its soft label is the fraction of completions that do. The last step
needs no rollout: the solution itself is its only completion. All prefixes of all solutions
are completed together, so the generation engine sees large batches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from reasonrl.generation import GenerationEngine, SamplingParams
from reasonrl.rewards.steps import NEGATIVE, POSITIVE, trajectory_steps
from reasonrl.rollout import RolloutPrefix, RolloutSettings, continue_rollouts


@dataclass(frozen=True)
class AnnotationStats:
    solutions: int
    steps: int
    rollouts: int
    seconds: float

    @property
    def rollouts_per_second(self) -> float:
        return self.rollouts / self.seconds if self.seconds else 0.0


def shepherd_labels(step_outcomes: list[list[bool]]) -> tuple[list[str], list[float]]:
    """Hard and soft labels of a solution's steps from the outcomes of their completions."""
    hard = [POSITIVE if any(o) else NEGATIVE for o in step_outcomes]
    soft = [sum(o) / len(o) for o in step_outcomes]
    return hard, soft


def annotate(
    problems: dict[str, dict],
    solutions: list[dict],
    engine: GenerationEngine,
    sandbox,
    limits: RolloutSettings,
    completions: int,
    params: SamplingParams,
    splitter: str,
    pattern: str,
) -> tuple[list[dict], AnnotationStats]:
    """PRM rows (schema prm_steps) for the sampled `solutions` (trajectory rows)."""
    started = time.perf_counter()
    steps_of = [trajectory_steps(s["messages"], splitter, pattern) for s in solutions]
    prefixes, owners = [], []  # owners[j] = (solution index, step index) of prefixes[j]
    for i, (solution, steps) in enumerate(zip(solutions, steps_of, strict=True)):
        problem = problems[solution["problem_id"]]
        for j, step in enumerate(steps[:-1]):
            for k in range(completions):
                prefixes.append(RolloutPrefix(problem, step.messages, step.partial, k))
                owners.append((i, j))
    finished = continue_rollouts(engine, prefixes, params, limits, sandbox) if prefixes else []
    outcomes: list[list[list[bool]]] = [[[] for _ in steps] for steps in steps_of]
    for (i, j), row in zip(owners, finished, strict=True):
        outcomes[i][j].append(row["correct"])
    rows = []
    for i, (solution, steps) in enumerate(zip(solutions, steps_of, strict=True)):
        if not steps:
            continue
        outcomes[i][-1] = [bool(solution["correct"])]
        hard, soft = shepherd_labels(outcomes[i])
        rows.append(
            {
                "problem_id": solution["problem_id"],
                "task": solution["task"],
                "sample": solution["sample"],
                "question": problems[solution["problem_id"]]["question"],
                "steps": [s.text for s in steps],
                "labels": hard,
                "soft_labels": soft,
                "source": "math-shepherd",
            }
        )
    stats = AnnotationStats(
        len(solutions), sum(map(len, steps_of)), len(prefixes), time.perf_counter() - started
    )
    return rows, stats

"""Drawing de-duplicated, disjoint train/test splits from a seeded problem generator."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TypeVar

from reasonrl.errors import ReasonRLError

Problem = TypeVar("Problem")
ATTEMPTS_PER_PROBLEM = 50


def _draw_unique(
    draw: Callable[[random.Random], tuple[Problem, str]],
    rng: random.Random,
    seen: set[str],
    count: int,
) -> list[Problem] | None:
    """`count` problems whose questions are new (added to `seen`); None if the space runs dry."""
    problems: list[Problem] = []
    for _ in range(ATTEMPTS_PER_PROBLEM * count + 1000):
        if len(problems) == count:
            break
        problem, question = draw(rng)
        if question not in seen:
            seen.add(question)
            problems.append(problem)
    return problems if len(problems) == count else None


def draw_splits(
    task: str,
    settings: dict,
    seed: int,
    draw: Callable[[random.Random], tuple[Problem, str]],
) -> dict[str, list[Problem]]:
    """Test and train problems, distinct by question text and disjoint.

    Each split has its own stream seeded from (seed, task, split); test is drawn first, so it
    does not change with train_size, and train skips every test question.
    """
    seen: set[str] = set()
    splits = {}
    for split, size in (("test", settings["test_size"]), ("train", settings["train_size"])):
        problems = _draw_unique(draw, random.Random(f"{seed}:{task}:{split}"), seen, size)
        if problems is None:
            raise ReasonRLError(
                f"{task}: cannot generate {size} distinct {split} problems with these settings; "
                f"lower tasks.{task}.train_size/test_size or widen its difficulty knobs"
            )
        splits[split] = problems
    return splits

"""Drawing de-duplicated, disjoint train/test splits and prompt pools from a seeded problem
generator."""

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


def pool_split(name: str) -> str:
    """The split name of a consumer's prompt pool."""
    return f"pool-{name}"


def draw_splits(
    task: str,
    settings: dict,
    seed: int,
    draw: Callable[[random.Random], tuple[Problem, str]],
) -> dict[str, list[Problem]]:
    """Test, train and pool problems, distinct by question text and disjoint.

    Each split has its own stream seeded from (seed, task, split); test is drawn first, so it
    does not change with train_size, then train, then each of `settings["pools"]` (name ->
    size) in its declared order as split `pool-{name}`: a pool skips every question before
    it, and adding one changes none of the splits drawn before it.
    """
    seen: set[str] = set()
    splits = {}
    pools = [(pool_split(name), size) for name, size in settings.get("pools", {}).items()]
    for split, size in [("test", settings["test_size"]), ("train", settings["train_size"])] + pools:
        problems = _draw_unique(draw, random.Random(f"{seed}:{task}:{split}"), seen, size)
        if problems is None:
            raise ReasonRLError(
                f"{task}: cannot generate {size} distinct {split} problems with these settings; "
                f"lower tasks.{task}.train_size/test_size or widen its difficulty knobs"
            )
        splits[split] = problems
    return splits

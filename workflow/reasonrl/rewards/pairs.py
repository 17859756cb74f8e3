"""Bradley-Terry preference pairs from SFT samples.

Per prompt, `selection` says which of the sampled responses are paired, the correct one
preferred:

- farthest (PF-PPO's recipe): the two with the maximum edit distance between them; a pair
  whose two responses are both correct or both wrong is dropped (a tie carries no preference);
- random (ablation): one correct and one wrong response drawn at random, from every prompt
  that has both;
- all (ablation): every correct x wrong combination of such a prompt.
"""

from __future__ import annotations

import itertools
import random
import re

from reasonrl.errors import ReasonRLError

WORD = re.compile(r"\w+|[^\w\s]")


def edit_distance(a: list[str], b: list[str]) -> int:
    """Levenshtein distance between two token lists (insert, delete, substitute cost 1)."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        current = [i]
        for j, y in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def response_text(messages: list[dict]) -> str:
    """Everything after the prompt turn: the response a pair compares."""
    return "\n".join(m["content"] for m in messages[1:])


def farthest_pair(samples: list[dict]) -> tuple[dict, dict]:
    """The two samples with the largest word-level edit distance (first such pair in order)."""
    if len(samples) < 2:
        raise ReasonRLError(f"problem {samples[0]['problem_id']}: need 2+ samples for a pair")
    words = [WORD.findall(response_text(s["messages"])) for s in samples]
    i, j = max(
        itertools.combinations(range(len(samples)), 2),
        key=lambda ij: (edit_distance(words[ij[0]], words[ij[1]]), -ij[0], -ij[1]),
    )
    return samples[i], samples[j]


PAIR_SELECTIONS = ("farthest", "random", "all")


def prompt_pairs(rows: list[dict], selection: str, rng: random.Random) -> list[tuple[dict, dict]]:
    """(chosen, rejected) samples of one prompt's rows under `selection`, one of
    PAIR_SELECTIONS (preference_pairs checks it)."""
    if selection == "farthest":
        a, b = farthest_pair(rows)
        if a["correct"] == b["correct"]:
            return []
        return [(a, b) if a["correct"] else (b, a)]
    right = [r for r in rows if r["correct"]]
    wrong = [r for r in rows if not r["correct"]]
    if not right or not wrong:
        return []
    if selection == "random":
        return [(rng.choice(right), rng.choice(wrong))]
    return list(itertools.product(right, wrong))


def preference_pairs(
    samples: list[dict], selection: str = "farthest", seed: int = 0
) -> tuple[list[dict], int]:
    """(pairs, number of prompts that gave no pair) from trajectory rows."""
    if selection not in PAIR_SELECTIONS:
        raise ReasonRLError(
            f"unknown pair selection {selection!r} (expected one of {PAIR_SELECTIONS})"
        )
    by_problem: dict[str, list[dict]] = {}
    for row in samples:
        by_problem.setdefault(row["problem_id"], []).append(row)
    rng = random.Random(seed)
    pairs, ties = [], 0
    for problem_id, rows in by_problem.items():
        chosen_rejected = prompt_pairs(sorted(rows, key=lambda r: r["sample"]), selection, rng)
        ties += not chosen_rejected
        pairs += [
            {
                "problem_id": problem_id,
                "task": chosen["task"],
                "chosen": chosen["messages"],
                "rejected": rejected["messages"],
                "edit_distance": edit_distance(
                    WORD.findall(response_text(chosen["messages"])),
                    WORD.findall(response_text(rejected["messages"])),
                ),
            }
            for chosen, rejected in chosen_rejected
        ]
    return pairs, ties

"""Bradley-Terry preference pairs from SFT samples (PF-PPO's recipe).

Per prompt, of the sampled responses take the two with the maximum edit distance between
them; the correct one is preferred, and a pair whose two responses are both correct or both
wrong is dropped (a tie carries no preference).
"""

from __future__ import annotations

import itertools
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


def preference_pairs(samples: list[dict]) -> tuple[list[dict], int]:
    """(pairs, number of prompts whose farthest pair was a tie) from trajectory rows."""
    by_problem: dict[str, list[dict]] = {}
    for row in samples:
        by_problem.setdefault(row["problem_id"], []).append(row)
    pairs, ties = [], 0
    for problem_id, rows in by_problem.items():
        a, b = farthest_pair(sorted(rows, key=lambda r: r["sample"]))
        if a["correct"] == b["correct"]:
            ties += 1
            continue
        chosen, rejected = (a, b) if a["correct"] else (b, a)
        pairs.append(
            {
                "problem_id": problem_id,
                "task": chosen["task"],
                "chosen": chosen["messages"],
                "rejected": rejected["messages"],
                "edit_distance": edit_distance(
                    WORD.findall(response_text(a["messages"])),
                    WORD.findall(response_text(b["messages"])),
                ),
            }
        )
    return pairs, ties

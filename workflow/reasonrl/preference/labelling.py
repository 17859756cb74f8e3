"""Labelling a round's trajectories: win/lose by the final answer, filters, pairs per prompt.

Winners whose last interpreter output (the turn before the answer) reports an error the
model ignored are dropped: the paper observes models that memorise the answer and print it
over broken code. Trajectories cut by a token cap are dropped from both sets. One random
winner and one random loser make the prompt's pair (the paper); with pairs_per_prompt > 1 more
of the prompt's losers, distinct, each get a random winner (a step-level pair scores where a
loser first goes wrong, so each loser carries its own error). KTO gets the first pair's two
rows as unpaired rows, and RAFT one random winner per prompt.
"""

from __future__ import annotations

import random
from collections import defaultdict

CAPPED = ("turn_token_cap", "total_token_cap")


def ignored_interpreter_error(row: dict) -> bool:
    """The turn before the final answer is interpreter output whose run did not end ok."""
    messages = row["messages"]
    before_last = messages[-2] if len(messages) >= 2 else None
    is_output = (
        before_last is not None
        and before_last["role"] == "user"
        and before_last["content"].startswith("```output")
    )
    return bool(is_output and row["tool_status"] and row["tool_status"][-1] != "ok")


def over_cap(row: dict, max_tokens: int) -> bool:
    return row["finish_reason"] in CAPPED or row["num_tokens"] > max_tokens


def prompt_turns(messages: list[dict]) -> list[dict]:
    """The turns before the model's first turn."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return messages[:first]


def label_preferences(
    trajectories: list[dict], max_tokens: int, seed: int, pairs_per_prompt: int = 1
) -> tuple[list[dict], list[dict], list[dict], dict]:
    """(pairs, unpaired KTO rows, RAFT winners, stats) of one round's trajectories."""
    by_problem: dict[str, list[dict]] = defaultdict(list)
    for row in trajectories:
        if any(m["role"] == "assistant" for m in row["messages"]):
            by_problem[row["problem_id"]].append(row)
    stats = {
        "prompts": len(by_problem),
        "trajectories": len(trajectories),
        "correct": sum(row["correct"] for row in trajectories),
        "dropped_ignored_error": 0,
        "dropped_over_cap": 0,
        "prompts_all_correct": 0,
        "prompts_none_correct": 0,
    }
    pairs, unpaired, winners = [], [], []
    paired_prompts = 0
    for problem_id in sorted(by_problem):
        rows = by_problem[problem_id]
        kept = [r for r in rows if not over_cap(r, max_tokens)]
        stats["dropped_over_cap"] += len(rows) - len(kept)
        won = [r for r in kept if r["correct"]]
        clean = [r for r in won if not ignored_interpreter_error(r)]
        stats["dropped_ignored_error"] += len(won) - len(clean)
        lost = [r for r in kept if not r["correct"]]
        stats["prompts_all_correct"] += bool(clean and not lost)
        stats["prompts_none_correct"] += not clean
        rng = random.Random(f"{seed}:{problem_id}")
        winner = rng.choice(clean) if clean else None
        if winner is not None:
            winners.append(_unpaired(winner, True))
        if winner is not None and lost:
            loser = rng.choice(lost)
            pairs.append(_pair(winner, loser))
            unpaired += [_unpaired(winner, True), _unpaired(loser, False)]
            paired_prompts += 1
            others = [r for r in lost if r is not loser]
            rng.shuffle(others)
            pairs += [_pair(rng.choice(clean), r) for r in others[: pairs_per_prompt - 1]]
    stats.update(
        pairs=len(pairs),
        unpaired=len(unpaired),
        winners=len(winners),
        coverage=paired_prompts / stats["prompts"] if stats["prompts"] else 0.0,
    )
    return pairs, unpaired, winners, stats


def _pair(winner: dict, loser: dict) -> dict:
    return {
        "problem_id": winner["problem_id"],
        "task": winner["task"],
        "prompt": prompt_turns(winner["messages"]),
        "chosen": winner["messages"],
        "rejected": loser["messages"],
        "chosen_policy": winner.get("policy", ""),
        "rejected_policy": loser.get("policy", ""),
    }


def _unpaired(row: dict, desirable: bool) -> dict:
    return {
        "problem_id": row["problem_id"],
        "task": row["task"],
        "messages": row["messages"],
        "desirable": desirable,
        "policy": row.get("policy", ""),
    }

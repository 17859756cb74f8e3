"""Hand-made outputs of the best-of-N and HGS-PRM stages (results/search/TASK/...), small
enough to check the comparisons and curves drawn from them by hand."""

from __future__ import annotations

from pathlib import Path

from reasonrl.io import write_jsonl

# Per problem: (final answer, correct, {scorer: score}) of each sample, in sample order.
# p0: the vote is right (2 x "3" against "4" and "5"), the PRM picks a wrong sample, the ORM
# the right one; p1: the vote is wrong ("7" twice, "6" once), both RMs pick the right one;
# p2: "3.0" and "3" are one answer (normalised), none is correct; p3: a 2-2 tie, one side right.
PROBLEMS = {
    "arith-test-00000": [
        ("3", True, {"prm-min": 0.2, "orm": 0.9}),
        ("4", False, {"prm-min": 0.8, "orm": 0.1}),
        ("3", True, {"prm-min": 0.3, "orm": 0.5}),
        ("5", False, {"prm-min": 0.1, "orm": 0.2}),
    ],
    "arith-test-00001": [
        ("7", False, {"prm-min": 0.1, "orm": 0.3}),
        ("6", True, {"prm-min": 0.9, "orm": 0.8}),
        ("7", False, {"prm-min": 0.2, "orm": 0.1}),
        (None, False, {"prm-min": 0.0, "orm": 0.0}),
    ],
    "arith-test-00002": [
        ("3.0", False, {"prm-min": 0.5, "orm": 0.5}),
        ("3", False, {"prm-min": 0.4, "orm": 0.6}),
        ("2", False, {"prm-min": 0.3, "orm": 0.7}),
        ("1", False, {"prm-min": 0.2, "orm": 0.8}),
    ],
    "arith-test-00003": [
        ("8", True, {"prm-min": 0.6, "orm": 0.2}),
        ("9", False, {"prm-min": 0.7, "orm": 0.1}),
        ("8", True, {"prm-min": 0.1, "orm": 0.3}),
        ("9", False, {"prm-min": 0.2, "orm": 0.4}),
    ],
}
GREEDY = {"arith-test-00000": True, "arith-test-00001": False, "arith-test-00002": False,
          "arith-test-00003": False}  # fmt: skip


def trajectory(problem_id: str, sample: int, answer: str | None, correct: bool, decoding: str):
    return {
        "problem_id": problem_id,
        "task": "arith",
        "sample": sample,
        "messages": [{"role": "user", "content": "q"}],
        "final_answer": answer,
        "correct": correct,
        "finish_reason": "answer" if answer is not None else "eos",
        "num_turns": 1,
        "num_tokens": 3,
        "tool_status": [],
        "decoding": decoding,
    }


def write_best_of_n(folder: Path) -> Path:
    """samples.jsonl (shuffled: readers must order by sample), scores.jsonl and greedy.jsonl."""
    samples, scores = [], []
    for pid, rows in PROBLEMS.items():
        for sample, (answer, correct, score) in enumerate(rows):
            samples.append(trajectory(pid, sample, answer, correct, "sampled"))
            scores.append(
                {"problem_id": pid, "sample": sample, "correct": correct, "scores": score}
            )
    write_jsonl(folder / "samples.jsonl", samples[::-1], schema="trajectory")
    write_jsonl(folder / "scores.jsonl", scores)
    greedy = [trajectory(pid, 0, "1", right, "greedy") for pid, right in GREEDY.items()]
    write_jsonl(folder / "greedy.jsonl", greedy, schema="trajectory")
    return folder


def write_hgs(folder: Path, outcomes: list[bool]) -> Path:
    """hgs/trajectories.jsonl: the search's answer on the first len(outcomes) problems."""
    rows = [
        trajectory(pid, 0, "1", right, "sampled")
        for pid, right in zip(list(PROBLEMS)[: len(outcomes)], outcomes, strict=True)
    ]
    write_jsonl(folder / "trajectories.jsonl", rows, schema="trajectory")
    return folder


def write_matched(folder: Path, counts: list[int]) -> Path:
    """hgs/matched.jsonl and matched_scores.jsonl: the first counts[i] samples of PROBLEMS'
    problem i as its compute-matched samples (HGS's budget paid for that many)."""
    samples, scores = [], []
    for (pid, rows), count in zip(PROBLEMS.items(), counts, strict=False):
        for sample, (answer, correct, score) in enumerate(rows[:count]):
            samples.append(trajectory(pid, sample, answer, correct, "sampled"))
            scores.append(
                {"problem_id": pid, "sample": sample, "correct": correct, "scores": score}
            )
    write_jsonl(folder / "matched.jsonl", samples[::-1], schema="trajectory")
    write_jsonl(folder / "matched_scores.jsonl", scores)
    return folder


def groups_by_hand() -> list[dict]:
    """The best-of-N stage's groups of PROBLEMS, answers normalised by hand ("3.0" is "3")."""
    return [
        {
            "correct": [correct for _, correct, _ in rows],
            "answers": [None if a is None else a.removesuffix(".0") for a, _, _ in rows],
            "scores": {k: [score[k] for _, _, score in rows] for k in ("prm-min", "orm")},
        }
        for rows in PROBLEMS.values()
    ]

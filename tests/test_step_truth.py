"""The exact correctness of arith step prefixes, and the precision/recall of Math-Shepherd's
"-" against it."""

from __future__ import annotations

import pytest

from reasonrl.rewards.step_truth import (
    annotation_label_quality,
    label_quality,
    prefix_truth,
    program_trace,
)
from reasonrl.rewards.steps import trajectory_steps
from reasonrl.tasks.arith import OPERATIONS, QUESTION, START, ArithProblem, Step, problem_row

PROBLEM = problem_row(
    ArithProblem(
        name="Tom",
        item="apples",
        box="bags",
        start=12,
        start_phrasing=START[0],
        steps=(
            Step("add", 5, 0, OPERATIONS["add"].phrasings[0]),
            Step("mul", 3, 0, OPERATIONS["mul"].phrasings[0]),
        ),
        question_phrasing=QUESTION[0],
    ),
    "arith",
    "train",
    0,
)


def trajectory(add_line: str = "x = x + 5", answer: str = "51") -> list[dict]:
    """The gold tool solution of PROBLEM with its add line and final answer replaced."""
    gold = PROBLEM["solutions"]["tool"]
    code = gold[0]["content"].replace("x = x + 5", add_line)
    output = gold[1]["content"] if answer == "51" else f"```output\n{answer}\n```"
    return [
        {"role": "user", "content": PROBLEM["question"]},
        {"role": "assistant", "content": code},
        {"role": "user", "content": output},
        {"role": "assistant", "content": f"The answer is \\boxed{{{answer}}}."},
    ]


def truth_of(messages: list[dict]) -> tuple[list[str], list[bool]]:
    steps = trajectory_steps(messages, "line", "")
    return [s.text for s in steps], prefix_truth(PROBLEM, steps)


def test_the_gold_solution_is_correct_at_every_line():
    texts, truth = truth_of(trajectory())
    assert len(texts) == 9  # intro, 3 x (comment, code), print with output, answer
    assert all(truth)


def test_a_wrong_constant_makes_its_line_and_every_later_prefix_wrong():
    texts, truth = truth_of(trajectory("x = x + 6", answer="54"))
    first_wrong = texts.index("x = x + 6")
    assert truth == [i < first_wrong for i in range(len(texts))]


def test_a_wrong_number_copied_into_a_comment_is_the_error():
    messages = trajectory()
    messages[1] = {**messages[1], "content": messages[1]["content"].replace("buys 5", "buys 6")}
    texts, truth = truth_of(messages)
    first_wrong = texts.index("# Tom buys 6 more apples.")
    assert truth == [i < first_wrong for i in range(len(texts))]


def test_the_same_running_total_written_another_way_is_correct():
    _, truth = truth_of(trajectory("x = 17"))
    assert all(truth)


def test_a_wrong_stated_answer_after_right_code_is_wrong_only_at_the_answer():
    _, truth = truth_of(trajectory(answer="50"))
    assert truth == [True] * 8 + [False]


@pytest.mark.parametrize("line", ["x = y + 5", "x = x +", "x = abs(x) + 5", "x += 5; y = 1"])
def test_a_line_outside_integer_arithmetic_is_an_error(line):
    texts, truth = truth_of(trajectory(line))
    assert truth[texts.index(line) - 1] and not truth[texts.index(line)]


def test_program_trace_reads_assignments_and_prints():
    assigned, printed = program_trace("# c\nx = 12\ny = x // 5\n\nprint(y * 2)\n")
    assert assigned == [12, 2] and printed == [(2, 4)]


def test_label_quality_counts_precision_and_recall_of_minus():
    truth = [True, True, False, False, False]
    hard = ["+", "-", "-", "-", "+"]
    soft = [0.75, 0.5, 0.25, 0.0, 0.5]
    quality = label_quality(truth, hard, soft)
    assert quality["steps"] == 5 and quality["negative_rate"] == 0.6
    assert quality["hard"] == {"precision": 2 / 3, "recall": 2 / 3, "support": 3}
    assert quality["soft"] == {"precision": 1.0, "recall": 2 / 3, "support": 3}


def test_annotation_label_quality_lines_rows_up_with_their_solutions():
    solution = {"problem_id": PROBLEM["id"], "sample": 0, "messages": trajectory("x = x + 6", "54")}
    row = {
        "problem_id": PROBLEM["id"],
        "sample": 0,
        "labels": ["+"] * 4 + ["-"] * 5,  # wrong from the add line (the 5th step) on
        "soft_labels": [1.0] * 4 + [0.0] * 5,
    }
    quality = annotation_label_quality({PROBLEM["id"]: PROBLEM}, [solution], [row], "line", "")
    assert quality["hard"] == {"precision": 1.0, "recall": 1.0, "support": 5}
    assert annotation_label_quality({}, [solution], [row], "line", "")["steps"] == 0

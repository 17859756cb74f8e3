import random

import pytest

from reasonrl.tasks.arith import code_constants, copy_accuracy, random_problem


def test_code_constants_skip_comments():
    code = "# Tom has 77 coins.\nx = 77\n# He gets 3 bags with 48.\nx = x + 3 * 48\nprint(x)\n"
    assert code_constants(code) == [77, 3, 48]


def test_copy_accuracy_of_the_gold_program_is_one():
    problem = random_problem(random.Random(0), num_ops=3, max_operand=99)
    assert copy_accuracy(problem.program(), problem.program()) == 1.0


def test_copy_accuracy_counts_a_dropped_digit_and_a_missing_line():
    gold = "x = 77\nx = x + 3 * 48\nx = x - 12\nprint(x)\n"
    assert copy_accuracy(gold, "x = 7\nx = x + 3 * 48\nx = x - 12\n") == pytest.approx(3 / 4)
    assert copy_accuracy(gold, "x = 77\nx = x + 3 * 48\n") == pytest.approx(3 / 4)
    assert copy_accuracy(gold, "") == 0.0


def test_copy_accuracy_needs_gold_constants():
    with pytest.raises(ValueError, match="no integer constants"):
        copy_accuracy("print(x)\n", "x = 1\n")


def _problem() -> dict:
    from reasonrl.tasks import build_problems

    train, _ = build_problems("arith", {"kind": "arith", "train_size": 1, "test_size": 1}, 0)
    return train[0]


def test_copy_summary_scores_the_gold_solution_one_and_a_miscopied_number_lower():
    from reasonrl.tasks.arith import assistant_code, copy_summary

    problem = _problem()
    gold = problem["solutions"]["tool"]
    code = assistant_code(gold)
    first = code_constants(code)[0]
    slipped = [
        {**m, "content": m["content"].replace(f"= {first}\n", f"= {first + 1}\n", 1)}
        if m["role"] == "assistant"
        else m
        for m in gold
    ]
    rows = [
        {"problem_id": problem["id"], "messages": gold},
        {"problem_id": problem["id"], "messages": slipped},
    ]
    summary = copy_summary([problem], rows)
    n = len(code_constants(code))
    assert summary["copy_accuracy"] == pytest.approx((1 + (n - 1) / n) / 2)
    assert summary["all_constants_copied"] == 0.5


def test_assistant_code_joins_only_the_assistant_blocks():
    from reasonrl.tasks.arith import assistant_code

    messages = [
        {"role": "user", "content": "```python\nx = 9\n```"},
        {"role": "assistant", "content": "a\n```python\nx = 1\n```"},
        {"role": "user", "content": "```output\n1\n```"},
        {"role": "assistant", "content": "```python\nprint(x)\n```"},
    ]
    assert assistant_code(messages) == "x = 1\nprint(x)\n"

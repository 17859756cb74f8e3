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

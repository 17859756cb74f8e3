"""Final-answer extraction, answer equivalence and the canonical form used for voting."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from reasonrl.tasks.grading import answers_equal, extract_answer, normalize_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("So the total is \\boxed{42}.", "42"),
        ("\\boxed{1} first, then \\boxed{2}", "2"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("nested \\boxed{\\sqrt{x^{2}}} here", "\\sqrt{x^{2}}"),
        ("\\boxed{ 7 } and text", "7"),
        ("\\fbox{9}", "9"),
        ("We add them. The answer is 17.", "17"),
        ("The answer is $\\frac{3}{4}$.", "\\frac{3}{4}"),
        ("the final answer is: 3.5.", "3.5"),
        ("I think 3 plus 4 gives 7 in total", "7"),
        ("There are 1,250 apples.", "1250"),
        ("It is -12.", "-12"),
        ("no numbers at all", None),
        ("\\boxed{unclosed", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("pred", "gold", "equal"),
    [
        ("42", "42", True),
        ("1,000", "1000", True),
        ("0.5", "1/2", True),
        ("\\frac{1}{2}", "0.5", True),
        ("3.0", "3", True),
        ("$3$", "3", True),
        ("0.333333", "1/3", True),
        ("1000000", "1000001", False),
        ("41", "42", False),
        ("-3", "3", False),
        ("(x+1)^2", "x^2+2x+1", True),
        ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2", True),
        ("\\{1,2\\}", "\\{2,1\\}", True),
        ("2\\pi", "\\pi", False),
        ("\\text{(A)}", "A", True),
        ("", "3", False),
        (None, "3", False),
        ("\\frac{", "3", False),
        ("}}}{{{\\left(", "x", False),
    ],
)
def test_answers_equal(pred, gold, equal):
    assert answers_equal(pred, gold) is equal


def test_answers_equal_works_off_the_main_thread():
    # math-verify's SIGALRM timeout cannot be set outside the main thread.
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(answers_equal, ["(x+1)^2", "x^2"], ["x^2+2x+1", "x^3"]))
    assert results == [True, False]


@pytest.mark.parametrize(
    ("answers", "same"),
    [
        (["3", "3.0", "6/2", "\\frac{6}{2}", " 3. ", "$3$"], True),
        (["1,000", "1000"], True),
        (["0.5", "1/2"], True),
        (["\\text{ yes }", "yes"], True),
        (["x + 1", "x+1"], True),
        (["90^\\circ", "90"], True),
        (["3", "4"], False),
        (["x+1", "x-1"], False),
    ],
)
def test_normalize_answer_groups_equal_answers(answers, same):
    assert (len({normalize_answer(a) for a in answers}) == 1) is same

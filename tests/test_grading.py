"""Final-answer extraction, answer equivalence and the canonical form used for voting."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from math_verify import parse, verify

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
        ("\\boxed{unclosed 5", None),  # a truncated box: no fallback to its numbers
        ("\\boxed{3} then \\boxed{4", "3"),
        ("The answer is 5. Then 7 more.", "5"),
        # the fallback takes the last complete numeric expression
        ("so x = 1/2", "1/2"),
        ("so we get 10^{3}", "10^{3}"),
        ("that is $x = \\frac{1}{2}$", "\\frac{1}{2}"),
        ("the value is 1.5 \\times 10^{3}.", "1.5 \\times 10^{3}"),
        ("about 50\\% of them", "50\\%"),
        ("a ratio of 3 / 4", "3 / 4"),
        ("roots 1, 2, 3", "3"),
        ("we have 3 - 4 = -1", "-1"),
        ("pay \\$1,000.50 now", "1000.50"),
        ("it is 2e-5 here", "2e-5"),
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


# Answer pairs in the MATH / GSM8K grading conventions and math-verify's verdict on each (the
# verdicts agree with the conventions: percentages equal their number and their fraction,
# units, dollars, degrees and \\text{} are decorations, decimals are rounded to 6 places).
MATH_VERIFY_TABLE = [
    # percent
    ("50\\%", "0.5", True),
    ("50%", "0.5", True),
    ("0.5", "50\\%", True),
    ("50\\%", "50", True),
    ("50", "50\\%", True),
    ("12.5\\%", "0.125", True),
    ("25\\%", "\\frac{1}{4}", True),
    ("40\\%", "0.5", False),
    ("5\\%", "50\\%", False),
    # thousands separators
    ("1,000", "1000", True),
    ("1,234,567", "1234567", True),
    ("1000000", "1,000,000", True),
    ("1,000", "100", False),
    ("12,345.5", "12345.5", True),
    ("1{,}000", "1000", True),
    # units and money
    ("10 \\text{ cm}", "10", True),
    ("10\\text{ meters}", "10", True),
    ("\\$5", "5", True),
    ("\\$18.90", "18.9", True),
    ("18.00", "18", True),
    ("5\\text{ inches}", "6", False),
    ("3\\mbox{ hours}", "3", True),
    ("7 \\text{cm}^2", "7", True),
    # fractions and decimals
    ("\\frac{3}{4}", "0.75", True),
    ("\\dfrac{3}{4}", "3/4", True),
    ("\\tfrac34", "3/4", True),
    ("\\frac34", "0.75", True),
    ("0.333", "1/3", False),
    ("0.3333333", "\\frac13", True),
    ("-\\frac{1}{2}", "-0.5", True),
    ("\\frac{2}{4}", "\\frac12", True),
    ("\\frac{1}{3}", "0.3", False),
    ("3/4", "4/3", False),
    ("\\frac{-1}{2}", "-\\frac{1}{2}", True),
    # scientific notation and powers
    ("1.5\\times10^{3}", "1500", True),
    ("3\\times 10^5", "300000", True),
    ("10^{3}", "1000", True),
    ("2^{10}", "1024", True),
    ("2^{-1}", "\\frac12", True),
    ("6.02\\times10^{23}", "602000000000000000000000", False),
    ("1.5\\times10^{3}", "150", False),
    ("10^{-2}", "0.01", True),
    # intervals
    ("[1,3)", "[1,3)", True),
    ("(1,3)", "[1,3]", False),
    ("(-\\infty, 2]", "(-\\infty,2]", True),
    ("x\\in[1,3)", "[1,3)", True),
    ("(-\\infty,0)\\cup(1,\\infty)", "(-\\infty,0)\\cup(1,\\infty)", True),
    ("[2,5]", "[2,6]", False),
    # sets and tuples
    ("\\{1,2,3\\}", "\\{3,2,1\\}", True),
    ("\\{1,2\\}", "\\{1,2,3\\}", False),
    ("(1,2)", "(1,2)", True),
    ("(2,1)", "(1,2)", False),
    ("1, 2, 3", "3, 2, 1", True),
    # degrees
    ("90^\\circ", "90", True),
    ("45°", "45", True),
    ("30^{\\circ}", "30", True),
    ("60^\\circ", "30", False),
    # text answers
    ("\\text{Monday}", "Monday", True),
    ("\\text{(C)}", "C", True),
    ("yes", "Yes", True),
    ("\\text{no}", "\\text{yes}", False),
    ("\\text{(A)}", "\\text{(B)}", False),
    # expressions
    ("2\\sqrt{2}", "\\sqrt{8}", True),
    ("\\pi", "3.14159", False),
    ("x=5", "5", True),
    ("5", "x=5", True),
    ("-3", "3", False),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}", True),
    ("x^2+2x+1", "(x+1)^2", True),
    ("2\\pi", "6.28", False),
    ("42", "42", True),
    ("41", "42", False),
    ("0", "0.0", True),
    ("-0", "0", True),
    ("007", "7", True),
    # rounding and tolerance, as math-verify rounds
    ("0.33333", "1/3", False),
    ("0.333333", "1/3", True),
    ("0.6667", "2/3", False),
    ("1.0000001", "1", False),
    ("0.0000001", "0", False),
    ("1/3", "0.333333", True),
    ("\\frac{1}{2}", "50\\%", True),
    ("0.1\\%", "0.001", True),
    ("100\\%", "1", True),
    ("0.5\\%", "0.5", False),
    ("1000000", "1000001", False),
    ("\\$1,000", "1000", True),
    ("18 \\text{ dollars}", "18", True),
]


def math_verify_equal(pred: str, gold: str) -> bool:
    return bool(verify(parse(f"${gold}$"), parse(f"${pred}$")))


def test_the_math_verify_table_is_large_and_two_sided():
    assert len(MATH_VERIFY_TABLE) >= 60
    assert {equal for _, _, equal in MATH_VERIFY_TABLE} == {True, False}


@pytest.mark.parametrize(("pred", "gold", "equal"), MATH_VERIFY_TABLE)
def test_the_grader_agrees_with_math_verify(pred, gold, equal):
    assert math_verify_equal(pred, gold) is equal
    assert answers_equal(pred, gold) is equal

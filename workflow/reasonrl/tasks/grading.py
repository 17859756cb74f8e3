"""Math answer grading: final-answer extraction, equivalence and a canonical form for voting.

Equivalence is math-verify's. A fast path answers first where it cannot disagree with it (the
hot path: arith and GSM8K answers are numbers): plain numbers of exactly the same value are
equal, two different whole numbers are not, and the same answer up to decorations (\\text{},
degrees, dollars, spacing) is equal. Everything else, percentages included (math-verify
takes `50\\%` as 50 or as 0.5, and rounds decimals against fractions), goes to math-verify.
"""

from __future__ import annotations

import logging
import re
import threading
from fractions import Fraction

from math_verify import parse, verify

# math-verify warns once that its signal-based timeout is off; we turn it off on purpose.
logging.getLogger("math_verify").setLevel(logging.ERROR)

MATH_VERIFY_TIMEOUT_S = 5
BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
ANSWER_IS = re.compile(r"answer is[:\s]*(.+?)(?:\.\s|\.?$|\n)", re.IGNORECASE | re.MULTILINE)
# The fallback answer: the last complete numeric expression of a text. A number (thousands
# grouped by commas, a decimal part, an e-exponent) with a minus sign that is not a
# subtraction, a LaTeX fraction, or a number followed by a power, "\\times 10^{n}",
# "/ denominator" or a percent sign.
_UNSIGNED = r"(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?"
_SIGN = r"(?:(?<![\w)}\]])-)?"
_EXPONENT = rf"\^(?:\{{\s*-?(?:{_UNSIGNED})\s*\}}|-?\d+)"
_LATEX_FRACTION = rf"\\[dt]?frac(?:\{{\s*-?(?:{_UNSIGNED})\s*\}}\{{\s*(?:{_UNSIGNED})\s*\}}|\d\d)"
NUMERIC_EXPRESSION = re.compile(
    rf"{_SIGN}(?:{_LATEX_FRACTION}|(?:{_UNSIGNED})"
    rf"(?:\s*\\times\s*10{_EXPONENT}|{_EXPONENT}|\s*/\s*(?:{_UNSIGNED}))?)(?:\s*\\?%)?"
)
PERCENT = re.compile(r"\\?%")
PLAIN_NUMBER = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?")
LATEX_FRACTION = re.compile(r"^(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}$")
# Wrappers that never change an answer's value.
DECORATIONS = (
    (re.compile(r"\\text\{\s*([^{}]*?)\s*\}"), r"\1"),
    (re.compile(r"\\(?:left|right|displaystyle|!|,|;)"), ""),
    (re.compile(r"\^\{?\\circ\}?|°|\\%|%|\$"), ""),
)


def _boxed_contents(text: str) -> list[str]:
    """Contents of every \\boxed{...} in `text`, braces balanced."""
    contents = []
    for match in BOXED.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                contents.append(text[start:i].strip())
                break
    return contents


def extract_answer(text: str) -> str | None:
    """The final answer of a text: the last \\boxed{}, else "The answer is X", else the last
    numeric expression (a fraction or a power whole). A text with an unclosed \\boxed{ (a
    truncated answer) has no answer unless an earlier box is complete."""
    if BOXED.search(text):
        boxed = _boxed_contents(text)
        return boxed[-1] if boxed else None
    stated = ANSWER_IS.findall(text)
    if stated:
        return stated[-1].strip().strip("$").strip()
    expressions = NUMERIC_EXPRESSION.findall(text)
    return expressions[-1].replace(",", "") if expressions else None


def stated_answer(text: str) -> str | None:
    """The answer a solution states: its last \\boxed{}, else "The answer is X"; None
    where it states none (no guess from the last number, as extract_answer makes)."""
    if BOXED.search(text) or ANSWER_IS.search(text):
        return extract_answer(text)
    return None


def _strip_decorations(text: str) -> str:
    text = text.strip()
    for pattern, replacement in DECORATIONS:
        text = pattern.sub(replacement, text)
    return text.strip().rstrip(".").strip()


def _as_fraction(text: str) -> Fraction | None:
    """The exact value of a plain number ("1,000", "0.5", "-3/4", "\\frac{1}{2}"), else None."""
    text = _strip_decorations(text).replace(" ", "")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text):
        text = text.replace(",", "")
    fraction = LATEX_FRACTION.match(text)
    if fraction:
        text = f"{fraction[1]}{fraction[2]}/{fraction[3]}"
    if not PLAIN_NUMBER.fullmatch(text):
        return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def normalize_answer(text: str) -> str:
    """Canonical string of an answer, for majority voting ("3.0", "3" and "6/2" give "3")."""
    value = _as_fraction(text)
    if value is not None:
        return str(value)
    return re.sub(r"\s+", "", _strip_decorations(text))


def _symbolic_equal(pred: str, gold: str) -> bool:
    # math-verify's timeouts use SIGALRM, which only the main thread may set.
    timeout = (
        MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    )
    try:
        gold_parsed = parse(f"${gold}$", parsing_timeout=timeout)
        pred_parsed = parse(f"${pred}$", parsing_timeout=timeout)
        if not gold_parsed or not pred_parsed:
            return False
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout))
    except Exception:  # a grader never crashes a run: math-verify can raise on odd input
        return False


def answers_equal(pred: str | None, gold: str) -> bool:
    """True when `pred` and `gold` are the same answer, as math-verify judges them."""
    if pred is None or not pred.strip():
        return False
    if not (PERCENT.search(pred) or PERCENT.search(gold)):
        pred_value, gold_value = _as_fraction(pred), _as_fraction(gold)
        if pred_value is not None and gold_value is not None:
            if pred_value == gold_value:
                return True
            if pred_value.denominator == gold_value.denominator == 1:
                return False  # two different whole numbers: no rounding makes them equal
        elif normalize_answer(pred) == normalize_answer(gold):
            return True
    return _symbolic_equal(pred, gold)

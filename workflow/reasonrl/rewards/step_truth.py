"""The exact correctness of every step prefix of an `arith` tool trajectory, from the gold
program, and how well Math-Shepherd's labels find the wrong ones.

A prefix is correct when it holds no error yet. Precisely, with the code written so far (the
lines of every code block through the step, an unclosed block included; comments and blank
lines left out) and the gold program's code read the same way:

- every statement is `name = <integer arithmetic>` or `print(<integer arithmetic>)` over
  integer constants and names assigned before (+, -, *, //, /, unary -); anything else (a
  syntax error, an unknown name, a call) is an error;
- the values assigned so far are the first values the gold program assigns, in order (the
  same running totals, however the model writes them), and no more of them than the gold has;
- every printed value is the gold's latest assigned value at that point;
- the integers written in comments so far are the gold comments' integers, in order (a
  comment restates a question sentence; a number copied wrongly there is the error the next
  line inherits);
- a text step that states a \\boxed{} answer states the gold answer;
- an error stays: every prefix after the first wrong one is wrong (Math-Shepherd's "-" says a
  prefix can no longer reach the answer; a later repair does not undo a written error here).

Text without an answer (the intro sentence) cannot be wrong by itself: it is as correct as
the prefix before it.
"""

from __future__ import annotations

import ast
import operator
import re
from fractions import Fraction

from reasonrl.rewards.models import per_label_precision_recall
from reasonrl.rewards.steps import NEGATIVE, POSITIVE, Step, trajectory_steps
from reasonrl.tasks.arith import assistant_code, comment_integers
from reasonrl.tasks.grading import extract_answer, normalize_answer

# A python block, closed or still open at the end of the text (a mid-turn prefix).
WRITTEN_BLOCK = re.compile(r"```python\n(.*?)(?:```|\Z)", re.DOTALL)
OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.truediv,
}
SOFT_THRESHOLD = 0.5  # a soft label below it reads as "-"


class _Unreadable(Exception):
    """A statement outside the integer-arithmetic language of arith programs."""


def _value(node: ast.expr, names: dict[str, Fraction]) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand, names)
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = _value(node.left, names), _value(node.right, names)
        if isinstance(node.op, ast.FloorDiv | ast.Div) and right == 0:
            raise _Unreadable("division by zero")
        return Fraction(OPERATORS[type(node.op)](left, right))
    raise _Unreadable(ast.dump(node))


def program_trace(code: str) -> tuple[list[Fraction], list[tuple[int, Fraction]]]:
    """(values assigned in order, (assignments before it, value) of every print) of `code`;
    _Unreadable at the first statement that is not integer arithmetic."""
    names: dict[str, Fraction] = {}
    assigned: list[Fraction] = []
    printed: list[tuple[int, Fraction]] = []
    for line in code.splitlines():
        if not line.split("#")[0].strip():
            continue
        try:
            (statement,) = ast.parse(line.strip()).body
        except (SyntaxError, ValueError) as error:
            raise _Unreadable(line) from error
        match statement:
            case ast.Assign(targets=[ast.Name(id=name)], value=expression):
                names[name] = _value(expression, names)
                assigned.append(names[name])
            case ast.Expr(value=ast.Call(func=ast.Name(id="print"), args=[argument], keywords=[])):
                printed.append((len(assigned), _value(argument, names)))
            case _:
                raise _Unreadable(line)
    return assigned, printed


def written_code(step: Step) -> str:
    """The code written through `step`: the blocks of its whole turns, then those of the
    part of the next turn it holds (an unclosed block included)."""
    turns = assistant_code(step.messages)
    return turns + "".join(WRITTEN_BLOCK.findall(step.partial))


def _code_consistent(code: str, gold_code: str, gold: list[Fraction]) -> bool:
    written = comment_integers(code)
    if written != comment_integers(gold_code)[: len(written)]:
        return False
    try:
        assigned, printed = program_trace(code)
    except _Unreadable:
        return False
    if assigned != gold[: len(assigned)]:
        return False
    return all(count > 0 and value == gold[count - 1] for count, value in printed)


def prefix_truth(problem: dict, steps: list[Step]) -> list[bool]:
    """Whether each step prefix of a trajectory of the arith `problem` is still correct (the
    module's definition), judged against the problem's gold tool solution."""
    gold_code = assistant_code(problem["solutions"]["tool"])
    gold, _ = program_trace(gold_code)
    answer = normalize_answer(problem["answer"])
    truth, correct = [], True
    for step in steps:
        correct = correct and _code_consistent(written_code(step), gold_code, gold)
        if correct and "\\boxed" in step.text:
            stated = extract_answer(step.text)
            correct = stated is not None and normalize_answer(stated) == answer
        truth.append(correct)
    return truth


def label_quality(truth: list[bool], hard: list[str], soft: list[float]) -> dict:
    """Precision and recall of the "-" label against the truth, for the hard labels and for
    the soft labels read at SOFT_THRESHOLD, over all steps given; and the true "-" rate."""
    real = [POSITIVE if t else NEGATIVE for t in truth]
    soft_hard = [POSITIVE if s >= SOFT_THRESHOLD else NEGATIVE for s in soft]
    return {
        "steps": len(real),
        "negative_rate": real.count(NEGATIVE) / len(real) if real else None,
        "hard": per_label_precision_recall(real, hard, [NEGATIVE])[NEGATIVE],
        "soft": per_label_precision_recall(real, soft_hard, [NEGATIVE])[NEGATIVE],
    }


def annotation_label_quality(
    problems: dict[str, dict], solutions: list[dict], rows: list[dict], splitter: str, pattern: str
) -> dict:
    """label_quality of Math-Shepherd rows (schema prm_steps) against the truth of their
    solutions' step prefixes; `problems` holds the arith problems (others are left out)."""
    by_sample = {(s["problem_id"], s["sample"]): s for s in solutions}
    truth, hard, soft = [], [], []
    for row in rows:
        if row["problem_id"] not in problems:
            continue
        messages = by_sample[(row["problem_id"], row["sample"])]["messages"]
        steps = trajectory_steps(messages, splitter, pattern)
        truth += prefix_truth(problems[row["problem_id"]], steps)
        hard += row["labels"]
        soft += row["soft_labels"]
    return label_quality(truth, hard, soft)

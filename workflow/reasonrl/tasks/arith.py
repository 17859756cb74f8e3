"""`arith`: multi-step arithmetic word problems that reward calling the interpreter.

One sentence per operation, numbers written as digits, and a gold program with one line per
sentence (each restated as a comment above its line), so a tiny model can learn the
sentence -> code mapping while the interpreter does the arithmetic (the chain-of-thought
variant has to do it in text).
"""

from __future__ import annotations

import contextlib
import io
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from reasonrl.chat import CODE_BLOCK
from reasonrl.tasks.sampling import draw_splits
from reasonrl.tasks.tool_turns import code_turn, output_turn

NAMES = ("Tom", "Anna", "Ben", "Maria", "Lily", "Sam", "Nora", "Omar", "Eva", "Raj", "Mia", "Leo")
ITEMS = ("marbles", "books", "coins", "apples", "stickers", "cards", "pencils", "shells")
CONTAINERS = ("bags", "boxes", "packs", "jars")
START = ("{name} has {a} {item}.", "{name} starts with {a} {item}.", "{name} owns {a} {item}.")
QUESTION = ("How many {item} does {name} have now?", "How many {item} does {name} have at the end?")
# Sentences about someone else: they change nothing, and the solution says so (a skill the
# frontier band asks for more often than the easy one).
DISTRACTORS = (
    "{other} has {a} {item}.",
    "{other} buys {a} {item}.",
    "{other} gives away {a} {item}.",
    "{other} finds {a} {box}.",
)
SKIP_NOTE = "# this is about {other}, not {name}: x does not change"
TOOL_INTRO = "Let me compute this step by step with Python."
MAX_GROUPS = 9  # group counts, multipliers and divisors stay single-digit, as in word problems
MAX_DIVISOR = 12


@dataclass(frozen=True)
class Operation:
    """One kind of step: its phrasings, its code line and how it changes the running total."""

    phrasings: tuple[str, ...]
    code: str
    apply: Callable[[int, int, int], int]
    # rng, total, max_operand -> operands (a, b), or None when the step cannot follow `total`
    draw: Callable[[random.Random, int, int], tuple[int, int] | None]


def _draw_sub(rng: random.Random, total: int, top: int) -> tuple[int, int] | None:
    # Keeps the total positive, so later steps (e.g. sharing) still make sense.
    return (rng.randint(2, min(top, total - 1)), 0) if total >= 3 else None


def _draw_sub_groups(rng: random.Random, total: int, top: int) -> tuple[int, int] | None:
    if total < 5:
        return None
    groups = rng.randint(2, min(MAX_GROUPS, (total - 1) // 2))
    return groups, rng.randint(2, min(top, (total - 1) // groups))


def _draw_div(rng: random.Random, total: int, top: int) -> tuple[int, int] | None:
    divisors = [d for d in range(2, min(MAX_DIVISOR, top, total) + 1) if total % d == 0]
    return (rng.choice(divisors), 0) if divisors else None


OPERATIONS = {
    "add": Operation(
        (
            "{name} buys {a} more {item}.",
            "{name} gets {a} {item} from a friend.",
            "{name} finds {a} {item}.",
        ),
        "x = x + {a}",
        lambda x, a, b: x + a,
        lambda rng, total, top: (rng.randint(2, top), 0),
    ),
    "sub": Operation(
        (
            "{name} gives away {a} {item}.",
            "{name} loses {a} {item}.",
            "{name} sells {a} {item}.",
        ),
        "x = x - {a}",
        lambda x, a, b: x - a,
        _draw_sub,
    ),
    "add_groups": Operation(
        (
            "{name} buys {a} {box} with {b} {item} in each.",
            "{name} receives {a} {box} that each hold {b} {item}.",
        ),
        "x = x + {a} * {b}",
        lambda x, a, b: x + a * b,
        lambda rng, total, top: (rng.randint(2, MAX_GROUPS), rng.randint(2, top)),
    ),
    "sub_groups": Operation(
        (
            "{name} gives {a} friends {b} {item} each.",
            "{name} packs {a} {box} with {b} {item} each and gives them away.",
        ),
        "x = x - {a} * {b}",
        lambda x, a, b: x - a * b,
        _draw_sub_groups,
    ),
    "mul": Operation(
        (
            "{name} ends up with {a} times as many {item}.",
            "The number of {name}'s {item} grows {a} times.",
        ),
        "x = x * {a}",
        lambda x, a, b: x * a,
        lambda rng, total, top: (rng.randint(2, MAX_GROUPS), 0),
    ),
    "div": Operation(
        (
            "{name} shares the {item} equally among {a} friends and keeps one share.",
            "{name} splits the {item} into {a} equal piles and keeps one pile.",
        ),
        "x = x // {a}",
        lambda x, a, b: x // a,
        _draw_div,
    ),
}
# How a step is written in the chain-of-thought solution: (intermediate, result) equations.
COT_STEPS = {
    "add": lambda x, a, b: [f"{x} + {a} = {x + a}."],
    "sub": lambda x, a, b: [f"{x} - {a} = {x - a}."],
    "add_groups": lambda x, a, b: [f"{a} * {b} = {a * b}.", f"{x} + {a * b} = {x + a * b}."],
    "sub_groups": lambda x, a, b: [f"{a} * {b} = {a * b}.", f"{x} - {a * b} = {x - a * b}."],
    "mul": lambda x, a, b: [f"{x} * {a} = {x * a}."],
    "div": lambda x, a, b: [f"{x} / {a} = {x // a}."],
}


@dataclass(frozen=True)
class Step:
    kind: str
    a: int
    b: int
    phrasing: str


@dataclass(frozen=True)
class Distractor:
    """A sentence about another person, placed after operation `after` (0: after the start)."""

    after: int
    other: str
    a: int
    phrasing: str


@dataclass(frozen=True)
class ArithProblem:
    name: str
    item: str
    box: str
    start: int
    start_phrasing: str
    steps: tuple[Step, ...]
    question_phrasing: str
    distractors: tuple[Distractor, ...] = ()

    def _fill(self, text: str, a: int = 0, b: int = 0, other: str = "") -> str:
        return text.format(name=self.name, item=self.item, box=self.box, a=a, b=b, other=other)

    def _parts(self) -> list[tuple[str, Step | Distractor | None]]:
        """(sentence, what it is) in question order: the start (None), then each operation,
        with the distractors placed among them."""
        parts: list[tuple[str, Step | Distractor | None]] = [
            (self._fill(self.start_phrasing, self.start), None)
        ]
        for index in range(len(self.steps) + 1):
            if index:
                step = self.steps[index - 1]
                parts.append((self._fill(step.phrasing, step.a, step.b), step))
            parts += [
                (self._fill(d.phrasing, d.a, other=d.other), d)
                for d in self.distractors
                if d.after == index
            ]
        return parts

    def sentences(self) -> list[str]:
        """Every sentence before the question, in order (distractors included)."""
        return [text for text, _ in self._parts()]

    def question(self) -> str:
        return " ".join([*self.sentences(), self._fill(self.question_phrasing)])

    def program(self) -> str:
        # Each line is preceded by the sentence it encodes, as a comment: the model restates
        # the sentence (a verbatim copy) and then turns that local text into code, which a
        # small model learns far sooner than finding each number in the question. A
        # distractor's comment is followed by a note saying why no line follows.
        lines = []
        for text, part in self._parts():
            if part is None:
                lines.append(f"# {text}\nx = {self.start}")
            elif isinstance(part, Distractor):
                lines.append(f"# {text}\n{SKIP_NOTE.format(other=part.other, name=self.name)}")
            else:
                lines.append(f"# {text}\n{OPERATIONS[part.kind].code.format(a=part.a, b=part.b)}")
        return "\n".join([*lines, "print(x)"]) + "\n"

    def cot(self, answer: str) -> str:
        # Restates each sentence before its equations, like the program's comments, so the
        # two solution styles differ only in who does the arithmetic.
        parts = []
        total = self.start
        for text, part in self._parts():
            parts.append(text)
            if isinstance(part, Distractor):
                parts.append(f"That is about {part.other}, so {self.name} still has {total}.")
            elif isinstance(part, Step):
                parts += COT_STEPS[part.kind](total, part.a, part.b)
                total = OPERATIONS[part.kind].apply(total, part.a, part.b)
        parts.append(f"The answer is \\boxed{{{answer}}}.")
        return " ".join(parts)


def run_program(program: str) -> str:
    """What the interpreter prints for our own generated program (trusted code, run in-process)."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(program, {})  # noqa: S102 - the program is generated here, never model-written
    return buffer.getvalue().rstrip("\n")  # as the sandbox shows it


_INTEGER = re.compile(r"\b\d+\b")


def code_constants(code: str) -> list[int]:
    """The integer literals of `code` in order, comments left out (they restate the question)."""
    return [int(n) for line in code.splitlines() for n in _INTEGER.findall(line.split("#")[0])]


def comment_integers(code: str) -> list[int]:
    """The integers of the comments of `code`, in order (the question's numbers restated):
    the other half of each line that code_constants reads."""
    return [
        int(n)
        for line in code.splitlines()
        if "#" in line
        for n in _INTEGER.findall(line[line.index("#") :])
    ]


def copy_accuracy(gold_program: str, code: str) -> float:
    """Share of the gold program's constants that `code` writes at the same position.

    The constants are the question's numbers copied into code; comparing position by
    position counts a dropped digit (77 written as 7) or a missing line as a miss.
    """
    gold = code_constants(gold_program)
    if not gold:
        raise ValueError("the gold program has no integer constants to copy")
    written = code_constants(code)
    return sum(g == w for g, w in zip(gold, written, strict=False)) / len(gold)


def assistant_code(messages: list[dict]) -> str:
    """The ```python blocks of the assistant turns, joined in order."""
    turns = (m["content"] for m in messages if m["role"] == "assistant")
    return "".join(block for text in turns for block in CODE_BLOCK.findall(text))


def copy_summary(problems: list[dict], trajectories: list[dict]) -> dict[str, float]:
    """Mean copy accuracy of one tool trajectory per problem against the problem's gold
    program, and the share of problems with every constant copied."""
    gold = {p["id"]: assistant_code(p["solutions"]["tool"]) for p in problems}
    scores = [
        copy_accuracy(gold[t["problem_id"]], assistant_code(t["messages"])) for t in trajectories
    ]
    if not scores:
        return {}
    return {
        "copy_accuracy": sum(scores) / len(scores),
        "all_constants_copied": sum(s == 1.0 for s in scores) / len(scores),
    }


def _step(rng: random.Random, total: int, top: int) -> Step:
    while True:
        kind = rng.choice(sorted(OPERATIONS))
        operands = OPERATIONS[kind].draw(rng, total, top)
        if operands is not None:
            return Step(kind, *operands, rng.choice(OPERATIONS[kind].phrasings))


def random_problem(
    rng: random.Random, num_ops: int, max_operand: int, num_distractors: int = 0
) -> ArithProblem:
    start = rng.randint(min(10, max_operand), max_operand)
    steps, total = [], start
    for _ in range(num_ops):
        step = _step(rng, total, max_operand)
        total = OPERATIONS[step.kind].apply(total, step.a, step.b)
        steps.append(step)
    problem = ArithProblem(
        name=rng.choice(NAMES),
        item=rng.choice(ITEMS),
        box=rng.choice(CONTAINERS),
        start=start,
        start_phrasing=rng.choice(START),
        steps=tuple(steps),
        question_phrasing=rng.choice(QUESTION),
    )
    # Drawn last, and only when asked for, so problems without distractors are the same
    # draws as before the knob existed.
    if num_distractors:
        others = [n for n in NAMES if n != problem.name]
        distractors = tuple(
            Distractor(
                rng.randint(0, num_ops),
                rng.choice(others),
                rng.randint(2, max_operand),
                rng.choice(DISTRACTORS),
            )  # fmt: skip
            for _ in range(num_distractors)
        )
        problem = replace(problem, distractors=distractors)
    return problem


def problem_row(problem: ArithProblem, task: str, split: str, index: int) -> dict:
    program = problem.program()
    output = run_program(program)
    return {
        "id": f"{task}-{split}-{index:05d}",
        "task": task,
        "split": split,
        "question": problem.question(),
        "answer": output,
        "solutions": {
            "tool": [
                code_turn(TOOL_INTRO, program),
                output_turn(output),
                {"role": "assistant", "content": f"The answer is \\boxed{{{output}}}."},
            ],
            "cot": [{"role": "assistant", "content": problem.cot(output)}],
        },
        "code": None,
        "meta": {
            "ops": [s.kind for s in problem.steps],
            "num_ops": len(problem.steps),
            "num_operands": 1 + sum(1 + (s.b > 0) for s in problem.steps),
            "num_distractors": len(problem.distractors),
            "item": problem.item,
        },
    }


def build(task: str, settings: dict, seed: int) -> dict[str, list[dict]]:
    """Rows of every split (train, test, pools; disjoint, de-duplicated by question),
    deterministic for the seed."""

    def draw(rng: random.Random) -> tuple[ArithProblem, str]:
        num_ops = rng.randint(settings["min_ops"], settings["max_ops"])
        low, high = settings["min_distractors"], settings["max_distractors"]
        distractors = rng.randint(low, high) if high else 0
        problem = random_problem(rng, num_ops, settings["max_operand"], distractors)
        return problem, problem.question()

    splits = draw_splits(task, settings, seed, draw)
    return {
        split: [problem_row(p, task, split, i) for i, p in enumerate(problems)]
        for split, problems in splits.items()
    }

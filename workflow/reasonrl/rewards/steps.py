"""Solutions as steps, and the chat formats the reward models read.

The step splitter says what a step of a math trajectory is: "line" (the default), one
reasoning line: a code or comment line inside a model turn's code block, a sentence or line
of text outside it; "turn", one model turn; "regex", a turn cut at a configured pattern. The
interpreter output that answers a turn belongs to the step that ends the turn. Code
solutions are cut into lines.

PRM format (RLHFlow / Math-Shepherd): each step is a user turn, the assistant answers with a
label token ("+" good, "-" bad, "~" neutral for the 3-class code PRM); the first user turn
also holds the question. The PRM's input holds the same fixed tag (STEP_TAG) as every
answer, at training and at scoring; only the training target at the tag is the label.
ORM format: the question and the whole solution in one user turn, the assistant answers
"+" or "-".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from reasonrl.chat import CODE_BLOCK
from reasonrl.errors import ReasonRLError
from reasonrl.tasks import is_code_task
from reasonrl.tasks.code_eval import FENCE

POSITIVE, NEGATIVE, NEUTRAL = "+", "-", "~"
LABELS = (POSITIVE, NEGATIVE, NEUTRAL)
# The answer every step's turn holds in the PRM's input, at training and at scoring alike
# (Math-Shepherd's step tag); the label is predicted at it, never shown to the model.
STEP_TAG = POSITIVE
SPLITTERS = ("line", "turn", "regex")
# Outside code: the gap after a sentence's end, or a line break.
TEXT_GAP = re.compile(r"(?<=[.!?:])\s+|\n\s*")


@dataclass(frozen=True)
class Step:
    """One step: its text for the PRM, and where a rollout that continues after it starts."""

    text: str
    messages: list[dict]  # conversation through this step (whole turns)
    partial: str = ""  # the part of the next model turn that belongs to this prefix


def split_text(text: str, pattern: str) -> list[tuple[int, int]]:
    """Character spans of the steps of `text`; `pattern` matches the separators between them.

    Each span runs to the start of the next step, so text[:end] of a span is the exact prefix a
    continuation resumes from. Empty pieces are dropped.
    """
    cuts = [m.end() for m in re.finditer(pattern, text) if 0 < m.end() < len(text)]
    bounds = [0, *cuts, len(text)]
    return [(lo, hi) for lo, hi in zip(bounds, bounds[1:], strict=False) if text[lo:hi].strip()]


def _contiguous_spans(text: str, cuts: list[int]) -> list[tuple[int, int]]:
    """Spans between `cuts` that cover `text`; a blank piece joins the step before it (the
    first, the step after it), so text[:end] is always the exact prefix to resume from."""
    bounds = [0, *sorted(c for c in set(cuts) if 0 < c < len(text)), len(text)]
    spans: list[tuple[int, int]] = []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        blank_here = not text[lo:hi].strip()
        if spans and (blank_here or not text[spans[-1][0] : spans[-1][1]].strip()):
            spans[-1] = (spans[-1][0], hi)
        else:
            spans.append((lo, hi))
    return spans if text.strip() else []


def split_lines(text: str) -> list[tuple[int, int]]:
    """Character spans of a model turn's reasoning lines: every line of a code block's body
    (the opening fence goes with its first line, the closing fence with its last), and
    every sentence or line of the text around the blocks."""
    cuts, outside_from = [], 0
    for block in CODE_BLOCK.finditer(text):
        cuts += [m.end() for m in TEXT_GAP.finditer(text, outside_from, block.start())]
        cuts.append(block.start())
        body_end = block.end(1)
        cuts += [i + 1 for i in range(block.start(1), body_end - 1) if text[i] == "\n"]
        outside_from = block.end()
    cuts += [m.end() for m in TEXT_GAP.finditer(text, outside_from)]
    return _contiguous_spans(text, cuts)


def trajectory_steps(messages: list[dict], splitter: str, pattern: str) -> list[Step]:
    """The steps of a trajectory (its messages, prompt first).

    splitter "turn": one step per model turn (with the interpreter output after it);
    "line": every model turn is cut into its reasoning lines (split_lines); "regex": every
    model turn is cut at `pattern`. A step inside a turn keeps the turn's text before its
    end as `partial`, so a continuation resumes exactly after it.
    """
    if splitter not in SPLITTERS:
        raise ReasonRLError(f"unknown step splitter {splitter!r} (expected one of {SPLITTERS})")
    steps: list[Step] = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        following = messages[i + 1] if i + 1 < len(messages) else None
        output = following if following and following["role"] == "user" else None
        through = messages[: i + 1 + (output is not None)]
        if splitter == "turn":
            text = message["content"] + (f"\n{output['content']}" if output else "")
            steps.append(Step(text.strip(), through))
            continue
        content = message["content"]
        spans = split_lines(content) if splitter == "line" else split_text(content, pattern)
        for j, (lo, hi) in enumerate(spans):
            piece = content[lo:hi].strip()
            if j + 1 < len(spans):
                steps.append(Step(piece, messages[:i], content[:hi]))
            else:
                text = piece + (f"\n{output['content']}" if output else "")
                steps.append(Step(text.strip(), through))
    return steps


def code_lines(program: str) -> list[str]:
    """Non-blank lines of a program: the steps of a code solution."""
    return [line for line in program.splitlines() if line.strip()]


def solution_code(messages: list[dict]) -> str | None:
    """The code of the last model turn's code block (what a code task's answer is)."""
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    blocks = FENCE.findall(replies[-1]) if replies else []
    return blocks[-1] if blocks else None


def solution_step_texts(
    problem: dict, messages: list[dict], splitter: str, pattern: str
) -> list[str]:
    """The step texts a PRM scores for a sampled solution of `problem`.

    Code tasks: the lines of the function (lines already in the prompt are not steps);
    math tasks: `trajectory_steps` with the configured splitter (reward_models.step_splitter,
    split_pattern).
    """
    if is_code_task(problem):
        code = solution_code(messages)
        if code is None:
            return [messages[-1]["content"].strip() or "(empty)"]
        prompt_lines = set(code_lines(problem["code"]["prompt"]))
        lines = [line for line in code_lines(code) if line not in prompt_lines]
        return lines or ["(empty)"]
    steps = trajectory_steps(messages, splitter, pattern)
    return [s.text for s in steps] or ["(empty)"]


def prm_messages(question: str, steps: list[str]) -> list[dict]:
    """The multi-turn PRM chat, every step answered by STEP_TAG: the PRM's input, the same at
    training and at scoring (the labels are training targets, models.prm_training_chat)."""
    if not steps:
        raise ReasonRLError("a PRM conversation needs at least one step")
    messages = []
    for i, step in enumerate(steps):
        content = f"{question}\n{step}" if i == 0 else step
        messages += [
            {"role": "user", "content": content},
            {"role": "assistant", "content": STEP_TAG},
        ]
    return messages


def check_labels(labels: list[str]) -> None:
    """An error naming the first label that is not one of LABELS."""
    bad = [label for label in labels if label not in LABELS]
    if bad:
        raise ReasonRLError(f"step label {bad[0]!r} is not one of {LABELS}")


def orm_messages(question: str, steps: list[str], label: str = POSITIVE) -> list[dict]:
    """The single-turn ORM chat: question and whole solution, answered by "+" or "-"."""
    solution = "\n".join(steps)
    return [
        {"role": "user", "content": f"{question}\n{solution}"},
        {"role": "assistant", "content": label},
    ]


def to_rlhflow(question: str, solutions: list[list[str]], correct: list[bool]) -> dict:
    """A row of the RLHFlow best-of-N evaluation format (steps joined by blank lines)."""
    return {
        "prompt": question,
        "answers": ["\n\n".join(steps) for steps in solutions],
        "labels": [int(c) for c in correct],
    }


def from_rlhflow(row: dict, where: str) -> tuple[str, list[list[str]], list[bool]]:
    """(question, step lists, correctness) of an RLHFlow row; answers split at blank lines."""
    missing = [k for k in ("prompt", "answers", "labels") if k not in row]
    if missing:
        raise ReasonRLError(f"{where}: RLHFlow row lacks '{missing[0]}'")
    if len(row["answers"]) != len(row["labels"]):
        raise ReasonRLError(f"{where}: 'answers' and 'labels' differ in length")
    solutions = [
        [piece.strip() for piece in re.split(r"\n\s*\n", answer) if piece.strip()] or [answer]
        for answer in row["answers"]
    ]
    return row["prompt"], solutions, [bool(label) for label in row["labels"]]

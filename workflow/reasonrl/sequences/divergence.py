"""Where two trajectories of one prompt first part ways: the step a step-level preference pair
scores (Step-DPO's credit assignment, carried to tool-integrated trajectories).

A step is one line of a model turn. Two trajectories agree up to the first message that
differs; inside that turn, up to the first line that differs. Each side's step is its line
there. When that line is the last of its turn, ending the turn is part of the step, so the
turn's end marker belongs to it; a side whose turn ended where the other went on has the end
marker alone as its step. Everything before the step is the shared context both sides are
scored in, and nothing after it is scored: a rejected trajectory that miscopies one number
and then goes on correctly no longer pushes its correct continuation down.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Divergence:
    """The first differing message (a model turn on both sides) and each side's step in it,
    as a character span of that message's content; a span that reaches the content's end
    takes the turn's end marker with it."""

    turn: int
    chosen: tuple[int, int]
    rejected: tuple[int, int]


def first_divergence(chosen: list[dict], rejected: list[dict]) -> Divergence | None:
    """Where `chosen` and `rejected` (whole conversations, prompt first) first differ, or None
    when they differ first outside a model turn (e.g. in an interpreter output) or not at all."""
    for turn, (a, b) in enumerate(zip(chosen, rejected, strict=False)):
        if a == b:
            continue
        if a["role"] != "assistant" or b["role"] != "assistant":
            return None
        span_a, span_b = diverging_lines(a["content"], b["content"])
        return Divergence(turn, span_a, span_b)
    return None


def diverging_lines(a: str, b: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """Character spans of the first line where texts `a` and `b` differ (a line keeps its
    newline; a text with no line left there gets the empty span at its end)."""
    lines_a, lines_b = a.splitlines(keepends=True), b.splitlines(keepends=True)
    offset = 0
    for line_a, line_b in zip(lines_a, lines_b, strict=False):
        if line_a != line_b:
            return (offset, offset + len(line_a)), (offset, offset + len(line_b))
        offset += len(line_a)
    # Every common line agrees: the step is each side's next line, if it has one.
    common = min(len(lines_a), len(lines_b))
    return _line_at(lines_a, common, offset), _line_at(lines_b, common, offset)


def _line_at(lines: list[str], index: int, offset: int) -> tuple[int, int]:
    """The span of line `index`, which starts at character `offset`; empty past the end."""
    return (offset, offset + len(lines[index])) if index < len(lines) else (offset, offset)

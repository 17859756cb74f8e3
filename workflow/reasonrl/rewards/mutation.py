"""Code PRM data by mutation (step-level reward model paper): lines are steps.

Each mutant changes ONE AST node of ONE line of the reference solution: an arithmetic or
comparison operator, a boolean operator, an integer constant off by one, a slice bound, or
the order of a call's first two arguments. Only mutants whose spliced source parses back to
exactly the mutated tree are kept. The unit tests then label the mutated line: passing ->
neutral ("~"), failing -> negative ("-"); the original lines are positive ("+").
"""

from __future__ import annotations

import ast
import copy
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from reasonrl.rewards.steps import NEGATIVE, NEUTRAL, POSITIVE
from reasonrl.sandbox.pool import WorkerPool
from reasonrl.tasks import program_with_tests

MUTATION_KINDS = ("arithmetic", "comparison", "boolean", "constant", "slice", "swap_args")
ARITHMETIC = {
    ast.Add: (ast.Sub, ast.Mult),
    ast.Sub: (ast.Add,),
    ast.Mult: (ast.Add, ast.FloorDiv),
    ast.Div: (ast.Mult,),
    ast.FloorDiv: (ast.Mult, ast.Mod),
    ast.Mod: (ast.FloorDiv,),
    ast.Pow: (ast.Mult,),
}
COMPARISON = {
    ast.Lt: (ast.LtE, ast.Gt),
    ast.LtE: (ast.Lt, ast.GtE),
    ast.Gt: (ast.GtE, ast.Lt),
    ast.GtE: (ast.Gt, ast.LtE),
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
}
BOOLEAN = {ast.And: ast.Or, ast.Or: ast.And}


@dataclass(frozen=True)
class Mutant:
    line: int  # index into the body's lines
    kind: str
    source: str  # the whole body with the one line changed
    mutated_line: str


def _mutations(node: ast.AST) -> Iterator[tuple[str, Callable[[ast.AST], None]]]:
    """(kind, in-place edit) for every way to mutate `node` itself."""
    if isinstance(node, (ast.BinOp, ast.AugAssign)):
        for new in ARITHMETIC.get(type(node.op), ()):
            yield "arithmetic", lambda n, new=new: setattr(n, "op", new())
    elif isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            for new in COMPARISON.get(type(op), ()):
                yield "comparison", lambda n, i=i, new=new: n.ops.__setitem__(i, new())
    elif isinstance(node, ast.BoolOp):
        yield "boolean", lambda n: setattr(n, "op", BOOLEAN[type(n.op)]())
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        for delta in (1, -1):
            yield "constant", lambda n, d=delta: setattr(n, "value", n.value + d)
    elif isinstance(node, ast.Slice):
        yield "slice", lambda n: setattr(n, "lower", _shift(n.lower, 1, ast.Constant(1)))
        yield "slice", lambda n: setattr(n, "upper", _shift(n.upper, -1, ast.Constant(-1)))
    elif isinstance(node, ast.Call):
        positional = [a for a in node.args if not isinstance(a, ast.Starred)]
        if len(positional) == len(node.args) >= 2:
            yield "swap_args", lambda n: n.args.__setitem__(slice(0, 2), n.args[1::-1][:2])


def _shift(bound: ast.expr | None, delta: int, default: ast.expr) -> ast.expr:
    """A slice bound moved by `delta` (a missing bound becomes `default`)."""
    if bound is None:
        return default
    if isinstance(bound, ast.Constant) and type(bound.value) is int:
        return ast.Constant(bound.value + delta)
    op = ast.Add() if delta > 0 else ast.Sub()
    return ast.BinOp(left=bound, op=op, right=ast.Constant(abs(delta)))


def _same_tree(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a, include_attributes=False) == ast.dump(b, include_attributes=False)


def _splice(lines: list[str], node: ast.AST, text: str) -> str:
    """The source with `node`'s (single-line) segment replaced by `text`."""
    row = node.lineno - 1
    line = lines[row]
    edited = line[: node.col_offset] + text + line[node.end_col_offset :]
    return "\n".join([*lines[:row], edited, *lines[row + 1 :]]) + "\n"


def mutants(body: str, kinds: tuple[str, ...] = MUTATION_KINDS) -> list[Mutant]:
    """Every single-node mutant of a function body (indented lines), in source order.

    The body is parsed inside a dummy function so `return` lines are valid.
    """
    wrapped = "def _f():\n" + body
    tree = ast.parse(wrapped)
    lines = wrapped.splitlines()
    body_rows = [i for i in range(1, len(lines)) if lines[i].strip()]
    found = []
    nodes = list(ast.walk(tree))
    for index, node in enumerate(nodes):
        if not hasattr(node, "lineno") or node.lineno != node.end_lineno or node.lineno < 2:
            continue
        for kind, edit in _mutations(node):
            if kind not in kinds:
                continue
            mutated_tree = copy.deepcopy(tree)
            target = list(ast.walk(mutated_tree))[index]
            edit(target)
            source = _spliced_source(lines, node, target, mutated_tree)
            if source is None:
                continue
            row = node.lineno - 1
            mutated_line = source.splitlines()[row]
            if mutated_line == lines[row]:
                continue
            new_body = "\n".join(source.splitlines()[1:]) + "\n"
            found.append(Mutant(body_rows.index(row), kind, new_body, mutated_line))
    unique: dict[tuple[int, str], Mutant] = {}
    for m in found:  # the same edit reached two ways (a slice bound is a constant) counts once
        unique.setdefault((m.line, m.mutated_line), m)
    return list(unique.values())


def _spliced_source(lines, node, target, mutated_tree) -> str | None:
    text = ast.unparse(target)
    for candidate in (text, f"({text})"):
        source = _splice(lines, node, candidate)
        try:
            if _same_tree(ast.parse(source), mutated_tree):
                return source
        except SyntaxError:
            continue
    return None


def body_lines(body: str) -> list[str]:
    return [line for line in body.splitlines() if line.strip()]


def mutation_rows(
    problems: list[dict],
    sandbox,
    max_mutants_per_line: int,
    kinds: tuple[str, ...],
    seed: int,
) -> tuple[list[dict], dict]:
    """PRM rows for code problems with a reference solution, and counts per label and kind."""
    rng = random.Random(seed)
    jobs: list[tuple[dict, Mutant | None]] = []
    for problem in problems:
        body = problem["code"]["canonical_solution"]
        by_line: dict[int, list[Mutant]] = {}
        for mutant in mutants(body, kinds):
            by_line.setdefault(mutant.line, []).append(mutant)
        jobs.append((problem, None))
        for line_mutants in by_line.values():
            rng.shuffle(line_mutants)
            jobs += [(problem, m) for m in line_mutants[:max_mutants_per_line]]
    programs = [
        program_with_tests(
            p, p["code"]["prompt"] + (m.source if m else p["code"]["canonical_solution"])
        )
        for p, m in jobs
    ]
    results = WorkerPool(sandbox).run(programs)
    passed = {
        p["id"] for (p, m), r in zip(jobs, results, strict=True) if m is None and r.status == "ok"
    }
    rows, counts = [], {"skipped_problems": len(problems) - len(passed)}
    for (problem, mutant), result in zip(jobs, results, strict=True):
        if problem["id"] not in passed:
            continue  # a reference that fails its own tests labels nothing
        lines = body_lines(problem["code"]["canonical_solution"])
        if mutant is None:
            steps, labels, kind = lines, [POSITIVE] * len(lines), "original"
        else:
            label = NEUTRAL if result.status == "ok" else NEGATIVE
            steps = [*lines[: mutant.line], mutant.mutated_line]
            labels, kind = [POSITIVE] * mutant.line + [label], mutant.kind
        counts[f"{kind}/{labels[-1]}"] = counts.get(f"{kind}/{labels[-1]}", 0) + 1
        rows.append(
            {
                "problem_id": problem["id"],
                "task": problem["task"],
                "sample": 0,
                "question": problem["question"],
                "steps": steps,
                "labels": labels,
                "soft_labels": None,
                "source": "mutation",
                "mutation": kind,
            }
        )
    return rows, counts

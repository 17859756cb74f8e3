"""OpenMathInstruct-1 rows become GSM8K/MATH problems with tool gold that SFT trains on."""

import json
import logging
import re

import pytest

from reasonrl.config import validate_config
from reasonrl.errors import ReasonRLError
from reasonrl.io import write_jsonl
from reasonrl.models import train_tokenizer
from reasonrl.stages.sft import sft_samples
from reasonrl.tasks import TOOL_INSTRUCTION, build_problems, extract_final, solution_messages

# Rows as nvidia/OpenMathInstruct-1 has them: one code block, two code blocks, a wrong
# solution, a text-only solution (the no_llm_code config).
CLIPS = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many "
    "clips in May. How many clips did Natalia sell altogether in April and May?",
    "generated_solution": "Let's solve this problem using Python code.\n<llm-code>\n"
    "clips_april = 48\nclips_may = clips_april / 2\nclips_april + clips_may\n</llm-code>\n"
    "<llm-code-output>\n72.0\n</llm-code-output>\nThus Natalia sold \\boxed{72} clips.",
    "expected_answer": "72",
    "predicted_answer": "72",
    "error_message": "",
    "is_correct": True,
    "generation_type": "masked_reference_solution",
    "dataset": "gsm8k",
}
MODULAR = {
    "question": "What is the smallest positive integer $n$ such that $17n \\equiv 1234 \\pmod{7}?$",
    "generated_solution": "Let's first reduce 1234 modulo 7.\n<llm-code>\nprint(1234 % 7)\n"
    "</llm-code>\n<llm-code-output>\n2\n</llm-code-output>\nSo we need $3n \\equiv 2 \\pmod 7$. "
    "Let's search for the smallest such $n$.\n<llm-code>\n"
    "next(n for n in range(1, 8) if (17 * n) % 7 == 2)\n</llm-code>\n"
    "<llm-code-output>\n3\n</llm-code-output>\nSo $n = \\boxed{3}$.",
    "expected_answer": "3",
    "predicted_answer": "3",
    "error_message": "",
    "is_correct": True,
    "generation_type": "without_reference_solution",
    "dataset": "math",
}
WRONG = {
    **CLIPS,
    "generated_solution": "<llm-code>\n48 + 48 * 2\n</llm-code>\n<llm-code-output>\n144\n"
    "</llm-code-output>\nSo she sold \\boxed{144} clips.",
    "predicted_answer": "144",
    "is_correct": False,
}
TEXT_ONLY = {
    "question": "What is $2 + 3$?",
    "generated_solution": "Adding the two numbers gives $2 + 3 = \\boxed{5}$.",
    "expected_answer": "5",
    "is_correct": True,
    "dataset": "math",
}
ROWS = [CLIPS, MODULAR, WRONG, TEXT_ONLY]


def _load(path, rows):
    write_jsonl(path, rows)
    settings = {"kind": "openmath", "path": str(path), "train_size": 0, "test_size": 0}
    return build_problems("om", settings, 0)


def test_code_blocks_become_the_project_tool_turns_and_wrong_rows_are_dropped(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        _, problems = _load(tmp_path / "openmath.jsonl", ROWS)
    assert [p["answer"] for p in problems] == ["72", "3", "5"]
    assert "om: skipped 1 test rows" in caplog.text
    clips, modular, text_only = problems
    assert clips["solutions"] == {
        "tool": [
            {
                "role": "assistant",
                "content": "Let's solve this problem using Python code.\n```python\n"
                "clips_april = 48\nclips_may = clips_april / 2\nclips_april + clips_may\n```",
            },
            {"role": "user", "content": "```output\n72.0\n```"},
            {"role": "assistant", "content": "Thus Natalia sold \\boxed{72} clips."},
        ]
    }
    assert modular["solutions"]["tool"] == [
        {
            "role": "assistant",
            "content": "Let's first reduce 1234 modulo 7.\n```python\nprint(1234 % 7)\n```",
        },
        {"role": "user", "content": "```output\n2\n```"},
        {
            "role": "assistant",
            "content": "So we need $3n \\equiv 2 \\pmod 7$. Let's search for the smallest such "
            "$n$.\n```python\nnext(n for n in range(1, 8) if (17 * n) % 7 == 2)\n```",
        },
        {"role": "user", "content": "```output\n3\n```"},
        {"role": "assistant", "content": "So $n = \\boxed{3}$."},
    ]
    assert text_only["solutions"]["tool"] == [
        {"role": "assistant", "content": TEXT_ONLY["generated_solution"]}
    ]
    assert modular["meta"] == {"dataset": "math", "generation_type": "without_reference_solution"}
    for problem in problems:
        assert extract_final(problem, problem["solutions"]["tool"]) == problem["answer"]
    write_jsonl(tmp_path / "rows.jsonl", problems, schema="problem")


@pytest.mark.parametrize(
    ("solution", "is_correct", "message"),
    [
        (
            "<llm-code>\nprint(1)\n</llm-code>\nThe answer is \\boxed{1}.",
            True,
            "an <llm-code> block without its closing tag or <llm-code-output>",
        ),
        ("It is 72.", True, "generated_solution does not end with a \\boxed{} answer"),
        (CLIPS["generated_solution"], "yes", "is_correct is 'yes', expected true or false"),
    ],
    ids=["code-without-output", "no-boxed-answer", "is-correct-not-bool"],
)
def test_a_malformed_row_fails_with_file_and_line(tmp_path, solution, is_correct, message):
    path = tmp_path / "openmath.jsonl"
    broken = {**CLIPS, "generated_solution": solution, "is_correct": is_correct}
    with pytest.raises(ReasonRLError, match=rf"^{re.escape(f'{path}:3: {message}')}$"):
        _load(path, [CLIPS, MODULAR, broken])


def test_openmath_needs_a_local_path():
    with pytest.raises(ReasonRLError, match=r"'tasks\.om\.path': openmath rows are read from"):
        build_problems("om", {"kind": "openmath"}, 0)


def test_sft_builds_tool_examples_from_the_loaded_rows(tmp_path):
    _, problems = _load(tmp_path / "openmath.jsonl", ROWS)
    texts = [json.dumps(row) for row in ROWS] * 5
    tokenizer = train_tokenizer(texts, vocab_size=400)
    samples = sft_samples(tokenizer, problems, "tool", 1024)
    assert len(samples) == len(problems)
    clips = samples[0]
    trained = tokenizer.decode(
        [t for t, m in zip(clips.input_ids, clips.loss_mask, strict=True) if m]
    )
    assert "clips_may = clips_april / 2" in trained and "\\boxed{72}" in trained
    assert "```output" not in trained and TOOL_INSTRUCTION not in trained
    with pytest.raises(ReasonRLError, match=r"no gold 'cot' solution"):
        solution_messages(problems[0], "cot")


def test_a_recipe_names_an_openmath_task_for_the_tool_variant():
    config = validate_config(
        {
            "tasks": {"om": {"kind": "openmath", "path": "data/openmath-{split}.jsonl"}},
            "sft": {"tasks": ["om"], "variants": ["tool"]},
        }
    )
    assert config["tasks"]["om"]["kind"] == "openmath"

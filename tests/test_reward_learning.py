"""Learning test: best-of-16 reranked by the Math-Shepherd PRM beats greedy pass@1 on arith.

A dedicated run of the DAG up to best-of-N, on config/test.yaml with one-operation arith
problems (single-digit operands), so the small test policy solves some of them after SFT
and its samples give the PRM both labels. Fixed seeds throughout.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

LEARN_CONFIG = """\
tasks:
  arith:
    kind: arith
    train_size: 1000
    test_size: 30
    min_ops: 1
    max_ops: 1
    max_operand: 9
sft:
  max_steps: 300
reward_models:
  tasks: [arith]
  prompts: 80
  samples_per_prompt: 4
  annotation:
    solutions_per_prompt: 4
    completions: 4
  train:
    max_steps: 80
    batch_size: 8
    lr: 0.001
    checkpoint_every: 100
    log_every: 10
  best_of_n:
    n: [1, 4, 16]
    max_problems: 20
"""


@pytest.mark.workflow
@pytest.mark.learning
def test_best_of_16_by_prm_beats_greedy_pass_at_1_on_arith(snakemake, tmp_path):
    shutil.copytree(REPO / "config", tmp_path / "config")
    (tmp_path / "config/learn.yaml").write_text(LEARN_CONFIG)
    target = "results/search/arith/best-of-n/best_of_n.json"
    snakemake(
        target,
        "--cores",
        "2",
        "--configfile",
        "config/test.yaml",
        "config/learn.yaml",
        cwd=tmp_path,
    )
    table = json.loads((tmp_path / target).read_text())
    prm_at_16 = next(
        row["accuracy"] for row in table["rows"] if row["N"] == 16 and row["method"] == "prm-mean@N"
    )
    assert prm_at_16 > table["greedy_pass@1"], table

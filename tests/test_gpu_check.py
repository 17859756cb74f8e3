"""bench/gpu_check.py (make gpu-check): the default DAG's main path on a GPU beside the memory
plan. Here, without a GPU, its dry form and the report it makes from a run's manifests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import gpu_check  # noqa: E402


def test_make_gpu_check_without_a_gpu_runs_its_dry_form():
    done = subprocess.run(["make", "-s", "gpu-check"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "bench/gpu_check.py: the dry form" in done.stdout
    assert "This was a dry-run" in done.stdout
    # the 15 jobs of SFT, one M-DPO round and the two frontier evaluations
    assert "\ntotal                   15\n" in done.stdout
    for rule in ("sft", "preference_train", "reference_logps", "sample_round", "evaluate"):
        assert f"plan: {rule} " in done.stdout


def _manifest(folder: Path, stage: str, seconds: float, host_mb: float, gpu_mb) -> None:
    folder.mkdir(parents=True)
    manifest = {"stage": stage, "wall_seconds": seconds, "peak_memory_mb": host_mb,
                "peak_gpu_memory_mb": gpu_mb}  # fmt: skip
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_each_job_is_reported_beside_its_rules_prediction(tmp_path):
    _manifest(tmp_path / "results/models/sft-tool", "sft", 42.0, 2048, 3072)
    _manifest(tmp_path / "results/data/arith", "make-data", 1.5, 100, None)
    rows = gpu_check.stage_rows(tmp_path)
    assert [r["rule"] for r in rows] == ["make_data", "sft"]
    table = gpu_check.job_table(rows, {"sft": 2.0})
    assert table == [
        ("make_data (results/data/arith)", "1.5 s, host 0.10 GiB, GPU no GPU"),
        ("sft (results/models/sft-tool)",
         "42.0 s, host 2.00 GiB, GPU 3.00 GiB (plan 2.00 GiB: measured 1.50x)"),
    ]  # fmt: skip


def test_the_plan_predicts_the_main_paths_training_rules():
    planned = gpu_check.predictions({"sft", "preference_train"})
    assert planned.keys() == {"sft", "preference_train"}
    # the round holds the policy's optimizer states beside the SFT's: more than SFT's
    assert planned["preference_train"] > planned["sft"] > 2.0  # the 2 GiB CUDA overhead

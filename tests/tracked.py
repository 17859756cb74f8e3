"""Helpers of the tracking tests: point a run's tracking at a folder, read TensorBoard back."""

from __future__ import annotations

import json
from pathlib import Path

from reasonrl.tracking import ENV_VAR

# What every training step logs, whatever the method.
COMMON = {"loss", "lr", "grad_norm", "tokens", "tokens_per_second", "seconds"}


def event_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of the TensorBoard event files in `folder`, read by TensorBoard."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def track(monkeypatch, tmp_path: Path, backend: str, run_name: str = "run1") -> Path:
    """Point the invocation's tracking at `tmp_path/tracking` (what the Snakefile does)."""
    settings = {
        "backend": backend,
        "dir": str(tmp_path / "tracking"),
        "project": "proj",
        "run_name": run_name,
        "offline": True,
    }
    monkeypatch.setenv(ENV_VAR, json.dumps(settings))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "tracking"


def trained_folders(workdir: Path) -> list[str]:
    """Output folders (below results/) of the training jobs a workflow run made that took a
    step: a model with the loop's metrics.csv, a row past its header (a BT-RM with no
    decisive pair writes its untrained head without training)."""
    return sorted(
        str(path.parent.relative_to(workdir / "results"))
        for path in (workdir / "results").rglob("metrics.csv")
        if (path.parent / "config.json").exists() and len(path.read_text().splitlines()) > 1
    )


def assert_one_tracking_run(workdir: Path) -> None:
    """Every training job of the invocation logged each step under one run name."""
    runs = list((workdir / "logs/tracking").iterdir())
    assert len(runs) == 1, runs
    run = runs[0]
    jobs = trained_folders(workdir)
    assert "models/sft-tool" in jobs, jobs
    logged = sorted(
        str(path.parent.relative_to(run)) for path in run.rglob("events.out.tfevents.*")
    )
    assert logged == jobs, f"tracked {logged}, trained {jobs}"
    for job in jobs:
        rows = (workdir / "results" / job / "metrics.csv").read_text().splitlines()
        assert len(event_scalars(run / job)["loss"]) == len(rows) - 1, job

"""What two runs of the workflow must agree on: every result file, timings left out.

Manifests (where and when each job ran) and wall-clock fields (JSON keys and CSV columns
whose name mentions seconds, e.g. tokens_per_second) legitimately differ between a local, a
SLURM and a container run; everything else, model weights included, must be identical.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path


def _is_timing(name: str) -> bool:
    return "second" in name  # seconds, train_seconds, tokens_per_second


def _without_timings(value):
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if not _is_timing(k)}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def comparable(path: Path) -> object:
    """A file's content with its timing fields removed (JSON, CSV), else its bytes."""
    if path.suffix == ".json":
        return _without_timings(json.loads(path.read_text()))
    if path.suffix == ".csv":
        rows = list(csv.reader(io.StringIO(path.read_text())))
        if not rows:
            return rows
        keep = [i for i, name in enumerate(rows[0]) if not _is_timing(name)]
        return [[row[i] for i in keep if i < len(row)] for row in rows]
    return path.read_bytes()


def result_files(workdir: Path) -> dict[str, Path]:
    """Every file under results/ but manifests, by path relative to results/."""
    root = workdir / "results"
    return {
        str(path.relative_to(root)): path
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != "manifest.json"
    }


def differing_results(reference: Path, other: Path) -> list[str]:
    """Result files missing from one run or differing beyond timings."""
    ours, theirs = result_files(reference), result_files(other)
    missing = sorted(set(ours) ^ set(theirs))
    return missing + [
        n for n in ours if n in theirs and comparable(ours[n]) != comparable(theirs[n])
    ]

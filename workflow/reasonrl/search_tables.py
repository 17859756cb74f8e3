"""Tables of the reward-model results: best-of-N per task and N, HGS-PRM vs greedy vs
sample-then-filter, and the PRM's held-out per-label precision/recall (Markdown + CSV)."""

from __future__ import annotations

from pathlib import Path

from reasonrl.io import read_json, write_csv, write_text


def _task_of(path: Path) -> str:
    return path.parent.parent.name  # results/search/{task}/{stage}/file


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _markdown(rows: list[dict], columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for row in rows:
        cells = [
            _fmt(row[c]) if row[c] is None or isinstance(row[c], float) else str(row[c])
            for c in columns
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def best_of_n_rows(paths: list[str]) -> list[dict]:
    rows = []
    for path in map(Path, paths):
        table = read_json(path)
        task = _task_of(path)
        rows.append(
            {
                "task": task,
                "N": 1,
                "method": "greedy",
                "accuracy": table["greedy_pass@1"],
                "ci_low": None,
                "ci_high": None,
            }
        )
        rows += [{"task": task, **row} for row in table["rows"]]
    return rows


def hgs_rows(paths: list[str]) -> list[dict]:
    rows = []
    for path in map(Path, paths):
        metrics = read_json(path)
        task = _task_of(path)
        stf = metrics["sample_then_filter"]
        rows += [
            {"task": task, "method": "greedy", **metrics["greedy"]},
            {
                "task": task,
                "method": "hgs-prm",
                "accuracy": metrics["hgs"]["accuracy"],
                "steps_per_problem": metrics["hgs"]["steps_per_problem"],
            },
            {
                "task": task,
                "method": f"sample{stf['n']}-then-filter",
                "accuracy": stf["accuracy_after"],
                "steps_per_problem": stf["steps_per_problem"],
            },
        ]
    return rows


def prm_rows(folders: list[str]) -> list[dict]:
    rows = []
    for folder in map(Path, folders):
        heldout = read_json(folder / "metrics.json")["heldout"]
        for label, stats in (heldout.get("per_label") or {}).items():
            rows.append({"prm": folder.name, "task": folder.parent.name, "label": label, **stats})
    return rows


def write_reward_tables(
    best_of_n: list[str], hgs: list[str], prms: list[str], out_dir: str
) -> None:
    out = Path(out_dir)
    bon = best_of_n_rows(best_of_n)
    search = hgs_rows(hgs)
    prm = prm_rows(prms)
    write_csv(out / "best_of_n.csv", bon)
    write_csv(out / "hgs.csv", search or [{"task": "", "method": ""}])
    write_csv(out / "prm_precision_recall.csv", prm or [{"prm": ""}])
    text = ["# Reward models and search", "", "## Best-of-N (accuracy, 95% bootstrap CI)", ""]
    for row in bon:
        row["ci"] = "" if row["ci_low"] is None else f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}]"
    text.append(_markdown(bon, ["task", "N", "method", "accuracy", "ci"]))
    text += ["## HGS-PRM vs greedy vs sample-then-filter", ""]
    text.append(
        _markdown(search, ["task", "method", "accuracy", "steps_per_problem"])
        if search
        else "(none)\n"
    )
    text += ["## PRM held-out steps: per-label precision / recall", ""]
    text.append(
        _markdown(prm, ["task", "label", "precision", "recall", "support"]) if prm else "(none)\n"
    )
    write_text(out / "reward_models.md", "\n".join(text))

"""Stage of workflow/rules/report.smk: results/report/, tables and plots of every evaluation
(and of SFT training); and, from that folder, the README's results section (`make readme`),
so that the numbers a newcomer reads are the ones the run produced."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from reasonrl.config import search_arm
from reasonrl.errors import ReasonRLError
from reasonrl.io import atomic_path, load_schema, read_json, write_json, write_text
from reasonrl.search import best_of_n_curve, read_best_of_n, search_arm_scores
from reasonrl.stats.comparisons import run_declared
from reasonrl.stats.tables import frame, markdown, write_csv

log = logging.getLogger(__name__)
REQUIRED_KEYS = ("policy", "task", "greedy_pass@1", "greedy_pass@1_ci")
# moving-average window of the plotted SFT loss; per-step losses are noisy
LOSS_SMOOTHING = 10


def report(
    metrics_paths: list[str],
    out_dir: str,
    train_metrics_paths: list[str] | None = None,
    comparisons: dict | None = None,
    arm_paths: dict[tuple[str, str], str] | None = None,
    best_paths: dict[str, str] | None = None,
    calibration_path: str | None = None,
    search_folders: dict[str, str] | None = None,
) -> None:
    """Write summary.csv/.md, pass_at_1.png, pass_at_k.png, sft_loss.png (when training
    metrics are given), comparisons.json/.csv/.md/.png (when the config section
    `comparisons` declares any: arm_paths maps each arm's (task, policy) to its test trajectories,
    best_paths each METHOD of a METHOD-best arm to select-best's best.json, search_folders
    each TASK/STAGE of a search arm to that stage's folder) and index.md, linking them, into
    out_dir; index.md shows calibrate's gates when calibration_path is given."""
    evaluations = sorted(
        (_read_evaluation(path) for path in metrics_paths), key=lambda m: (m["task"], m["policy"])
    )
    if not evaluations:
        raise ReasonRLError("report: no evaluation metrics given")
    out = Path(out_dir)
    ks = sorted({_k_of(key) for m in evaluations for key in m if key.startswith("pass@")})
    rows = [_summary_row(m, ks) for m in evaluations]
    write_csv(frame(rows), out / "summary.csv")
    table = _markdown_table(rows)
    write_text(out / "summary.md", table)
    _save(_pass_at_1_figure(evaluations), out / "pass_at_1.png")
    _save(_pass_at_k_figure(evaluations, ks), out / "pass_at_k.png")
    pictures = ["pass_at_1.png", "pass_at_k.png"]
    if train_metrics_paths:
        runs = [_read_training(path) for path in train_metrics_paths]
        _save(_loss_figure(runs), out / "sft_loss.png")
        pictures.append("sft_loss.png")
    if comparisons and comparisons["declared"]:
        picked = {method: read_json(path)["best"] for method, path in (best_paths or {}).items()}
        declared, alpha = comparisons["declared"], comparisons["alpha"]
        search = search_scores(declared, search_folders or {})
        rows = run_declared(declared, arm_paths or {}, picked, alpha, search)
        table += "\n" + _write_comparisons(rows, out, comparisons["alpha"])
        pictures.append("comparisons.png")
    if calibration_path:
        table += "\n" + calibration_table(read_json(calibration_path))
    write_text(out / "index.md", _index(table, pictures))


def search_scores(
    declared: list[dict], folders: dict[str, str]
) -> dict[tuple[str, str], dict[str, float]]:
    """(task, arm) -> per-problem scores of every search arm a declared comparison names;
    `folders` maps "task/stage" (best-of-n, hgs) to the stage's output folder."""
    scores = {}
    for comparison in declared:
        task = comparison["task"]
        for arm in (comparison["a"], comparison["b"]):
            spec = search_arm(arm)
            if spec is None:
                continue
            key = f"{task}/{spec.stage}"
            if key not in folders:
                raise ReasonRLError(f"comparison arm '{arm}': no {spec.stage} folder of '{task}'")
            scores[task, arm] = search_arm_scores(spec, folders[key])
    return scores


def calibration_table(calibration: dict) -> str:
    """calibration.json as Markdown: what was measured, at which temperature (and the
    methods' own where they differ), then one row per gate."""
    sampled = calibration["sampled_at"]
    measures = calibration["measures"]
    k = calibration["k"]
    lines = [
        f"Calibration of {calibration['policy']} (easy: {calibration['easy_task']}, frontier:"
        f" {calibration['frontier_task']}, {measures['frontier_problems']} problems x"
        f" {measures['samples_per_problem']} samples at {sampled['key']} ="
        f" {sampled['temperature']}): frontier pass@{k} {measures[f'frontier_pass@{k}']:.3f},"
        f" sampled pass@1 {measures['frontier_sampled_pass@1']:.3f}."
    ]
    for key in calibration["temperature_differs"]:
        method_temperature = calibration["method_temperatures"][key]
        lines.append(f"The samples' temperature differs from {key} = {method_temperature}.")
    rows = [
        {
            "gate": gate["gate"],
            "measure": gate["measure"],
            "value": f"{gate['value']:.3f}",
            "bound": f"{'>=' if gate['kind'] == 'min' else '<='} {gate['bound']}",
            "verdict": "passed" if gate["passed"] else "FAILED",
        }
        for gate in calibration["gates"]
    ]
    lines += ["", markdown(frame(rows))] if rows else []
    return "\n".join(lines) + "\n"


COMPARISON_COLUMNS = [
    "name", "metric", "a", "b", "n", "value_a", "value_b", "diff", "ci_low", "ci_high",
    "margin", "test", "p", "p_holm", "power",
]  # fmt: skip


def _write_comparisons(rows: list[dict], out: Path, alpha: float) -> str:
    """comparisons.json (schema-checked rows), .csv, .md and the forest plot; returns the
    Markdown table."""
    validator = jsonschema.Draft202012Validator(load_schema("comparison"))
    for row in rows:
        validator.validate(row)
    write_json(out / "comparisons.json", rows)
    table = frame([{key: row.get(key) for key in COMPARISON_COLUMNS} for row in rows])
    write_csv(table, out / "comparisons.csv")
    shown = table.assign(verdict=[verdict(row, alpha) for row in rows])
    text = markdown(shown.map(lambda v: f"{v:.4g}" if isinstance(v, float) else v))
    write_text(out / "comparisons.md", text)
    _save(_forest_figure(rows), out / "comparisons.png")
    for row in rows:
        log.info(
            "%s: %s - %s = %+.3f [%.3f, %.3f], p_holm %.3g",
            row["name"], row["a"], row["b"], row["diff"], row["ci_low"], row["ci_high"],
            row["p_holm"],
        )  # fmt: skip
    return text


def verdict(row: dict, alpha: float) -> str:
    if "margin" in row:
        shown = row["ci_low"] > -row["margin"] and row["p_holm"] < alpha
        return f"a >= b - {row['margin']:g}" if shown else "non-inferiority not shown"
    if row["ci_low"] > 0 and row["p_holm"] < alpha:
        return "a > b"
    if row["ci_high"] < 0 and row["p_holm"] < alpha:
        return "a < b"
    return "no difference shown"


def _forest_figure(rows: list[dict]) -> Figure:
    figure = Figure(figsize=(6, 0.6 * len(rows) + 1.2))
    axes = figure.add_subplot()
    positions = np.arange(len(rows))[::-1]
    diffs = np.array([row["diff"] for row in rows])
    errors = np.array([[r["diff"] - r["ci_low"], r["ci_high"] - r["diff"]] for r in rows]).T
    axes.errorbar(diffs, positions, xerr=errors, fmt="o", capsize=4)
    axes.axvline(0, color="grey", linewidth=1)
    for position, row in zip(positions, rows, strict=True):
        if "margin" in row:  # the non-inferiority bound the CI has to clear
            axes.plot([-row["margin"]] * 2, [position - 0.3, position + 0.3], "r-")
    axes.set_yticks(positions, [f"{r['name']}\np_holm={r['p_holm']:.3g}" for r in rows])
    axes.set_xlabel("difference a - b (paired bootstrap 95% CI)")
    figure.tight_layout()
    return figure


def _read_evaluation(path: str) -> dict[str, Any]:
    metrics = read_json(path)
    for key in REQUIRED_KEYS:
        if key not in metrics:
            raise ReasonRLError(f"{path}: missing key '{key}'")
    return metrics


def _read_training(path: str) -> dict[str, Any]:
    metrics = read_json(path)
    for key in ("name", "history"):
        if key not in metrics:
            raise ReasonRLError(f"{path}: missing key '{key}'")
    return metrics


def _k_of(key: str) -> int:
    return int(key.split("@", 1)[1])


def _summary_row(metrics: dict[str, Any], ks: list[int]) -> dict[str, Any]:
    low, high = metrics["greedy_pass@1_ci"]
    row = {
        "policy": metrics["policy"],
        "task": metrics["task"],
        "n_problems": metrics.get("n_problems"),
        "n_samples": metrics.get("n_samples"),
        "greedy_pass@1": metrics["greedy_pass@1"],
        "ci_low": low,
        "ci_high": high,
    }
    row.update({f"pass@{k}": metrics.get(f"pass@{k}") for k in ks})
    row.update({f"maj@{k}": metrics.get(f"maj@{k}") for k in ks})
    return row


def _markdown_table(rows: list[dict[str, Any]]) -> str:
    table = frame(rows)
    sampled = [c for c in table.columns if "@" in c and c != "greedy_pass@1"]
    shown = table[["policy", "task"]].copy()
    shown["n_problems"] = table["n_problems"].map(_cell)
    shown["n_samples"] = table["n_samples"].map(_cell)
    shown["greedy pass@1 [95% CI]"] = [_with_ci(row) for row in rows]
    for column in sampled:
        shown[column] = table[column].map(_cell)
    return markdown(shown)


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _save(fig: Figure, path: Path) -> None:
    FigureCanvasAgg(fig)  # render with Agg: no display, no pyplot global state
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)


def _pass_at_1_figure(evaluations: list[dict[str, Any]]) -> Figure:
    tasks = list(dict.fromkeys(m["task"] for m in evaluations))
    policies = list(dict.fromkeys(m["policy"] for m in evaluations))
    by_key = {(m["policy"], m["task"]): m for m in evaluations}
    width_inches = max(5.0, 1.0 + len(tasks) * (0.6 * len(policies) + 0.8))
    fig = Figure(figsize=(width_inches, 4), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(policies)
    x = np.arange(len(tasks))
    for i, policy in enumerate(policies):
        present = [j for j, task in enumerate(tasks) if (policy, task) in by_key]
        values = [by_key[policy, tasks[j]]["greedy_pass@1"] for j in present]
        cis = np.array([by_key[policy, tasks[j]]["greedy_pass@1_ci"] for j in present])
        errors = np.clip([np.subtract(values, cis[:, 0]), np.subtract(cis[:, 1], values)], 0, None)
        ax.bar(
            x[present] + (i - (len(policies) - 1) / 2) * width,
            values,
            width,
            yerr=errors,
            capsize=4,
            label=policy,
        )
    ax.set_xticks(x, tasks)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("task")
    ax.set_ylabel("greedy pass@1")
    ax.set_title("Greedy pass@1 per policy (95% bootstrap CI over problems)")
    ax.legend(title="policy")
    return fig


def _pass_at_k_figure(evaluations: list[dict[str, Any]], ks: list[int]) -> Figure:
    tasks = list(dict.fromkeys(m["task"] for m in evaluations))
    fig = Figure(figsize=(5 * len(tasks), 4), layout="constrained")
    axes = fig.subplots(1, len(tasks), squeeze=False)[0]
    for ax, task in zip(axes, tasks, strict=True):
        for i, metrics in enumerate(m for m in evaluations if m["task"] == task):
            measured = [k for k in ks if f"pass@{k}" in metrics]
            color = f"C{i}"
            ax.plot(
                measured,
                [metrics[f"pass@{k}"] for k in measured],
                "o-",
                color=color,
                label=f"{metrics['policy']} pass@k",
            )
            ax.plot(
                measured,
                [metrics[f"maj@{k}"] for k in measured],
                "s--",
                color=color,
                label=f"{metrics['policy']} maj@k",
            )
        if not ks:
            ax.text(
                0.5, 0.5, "no sampled evaluations", ha="center", va="center", transform=ax.transAxes
            )
        else:
            ax.set_xscale("log", base=2)
            ax.set_xticks(ks, [str(k) for k in ks])
            ax.legend(fontsize="small")
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("k (samples)")
        ax.set_ylabel("score")
        ax.set_title(f"{task}: pass@k (solid) and maj@k (dashed)")
    return fig


def _loss_figure(runs: list[dict[str, Any]]) -> Figure:
    fig = Figure(figsize=(10, 4), layout="constrained")
    loss_ax, lr_ax = fig.subplots(1, 2)
    for i, run in enumerate(runs):
        steps = np.array([h["step"] for h in run["history"]])
        losses = np.array([h["loss"] for h in run["history"]])
        color = f"C{i}"
        loss_ax.plot(steps, losses, color=color, alpha=0.25, linewidth=0.8)
        window = min(LOSS_SMOOTHING, len(losses))
        if window:
            smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
            loss_ax.plot(steps[window - 1 :], smooth, color=color, label=run["name"])
        lr_ax.plot(
            steps, [h.get("lr", np.nan) for h in run["history"]], color=color, label=run["name"]
        )
    loss_ax.set_title(f"SFT training loss (faint: per step; solid: {LOSS_SMOOTHING}-step mean)")
    loss_ax.set_xlabel("optimizer step")
    loss_ax.set_ylabel("loss (assistant tokens)")
    loss_ax.legend()
    lr_ax.set_title("learning rate")
    lr_ax.set_xlabel("optimizer step")
    lr_ax.set_ylabel("lr")
    lr_ax.legend()
    return fig


def _index(table: str, pictures: list[str]) -> str:
    lines = ["# reasonrl report", "", table, "- [summary table (markdown)](summary.md)"]
    lines.append("- [summary table (CSV)](summary.csv)")
    lines += [f"- [{name}]({name})" for name in pictures]
    lines.append("")
    lines += [f"![{os.path.splitext(name)[0]}]({name})\n" for name in pictures]
    return "\n".join(lines)


# ---- report_pages: every result table as an HTML page, the curves of best-of-N and rounds ----

ROUND_POLICY = re.compile(r"^(?P<method>.+)-round(?P<round>\d+)$")


def report_pages(
    tables: dict[str, str],
    out_dir: str,
    best_of_n: dict[str, str] | None = None,
    preference: str | None = None,
) -> None:
    """tables/NAME.html for each result table (NAME -> its CSV), so `snakemake --report` shows
    them as tables; best_of_n.png, with its numbers in best_of_n_curves.csv/.json (accuracy
    against N = 1, 2, 4, ... per selection method and task, from each TASK's best-of-N stage
    folder in best_of_n); rounds.png (held-out pass@1 per round and method) from the
    preference table."""
    out = Path(out_dir)
    (out / "tables").mkdir(parents=True, exist_ok=True)
    for name, path in tables.items():
        write_text(out / "tables" / f"{name}.html", _html_page(name, _read_csv(path)))
    if best_of_n:
        curves = [
            {"task": task, **row}
            for task, folder in best_of_n.items()
            for row in best_of_n_curve(list(read_best_of_n(folder).values()))["rows"]
        ]
        write_json(out / "best_of_n_curves.json", curves)
        write_csv(frame(curves), out / "best_of_n_curves.csv")
        _save(_best_of_n_figure(pd.DataFrame(curves)), out / "best_of_n.png")
    if preference:
        _save(_rounds_figure(_read_csv(preference)), out / "rounds.png")


def _read_csv(path: str) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise ReasonRLError(f"{path}: unreadable table: {str(err).splitlines()[0]}") from None


PAGE_STYLE = (
    "body{font-family:sans-serif;margin:1.5em}"
    "table{border-collapse:collapse;font-size:14px}"
    "th,td{border:1px solid #ccc;padding:4px 8px;text-align:right}"
    "th{background:#f3f3f3}"
)


def _html_page(name: str, table: pd.DataFrame) -> str:
    body = table.to_html(index=False, na_rep="–", float_format=lambda v: f"{v:.4g}", border=0)
    return (
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{name}</title>'
        f"<style>{PAGE_STYLE}</style></head>\n<body><h1>{name}</h1>\n{body}\n</body></html>\n"
    )


def _best_of_n_figure(rows: pd.DataFrame) -> Figure:
    """Accuracy against N per method and task; pass@N (the ceiling) and pass@1 dashed, a
    weighted vote dotted in the colour of the reward model weighing it."""
    tasks = list(dict.fromkeys(rows["task"]))
    fig = Figure(figsize=(6 * len(tasks), 4.5), layout="constrained")
    for ax, task in zip(fig.subplots(1, len(tasks), squeeze=False)[0], tasks, strict=True):
        curves = rows[rows["task"] == task].groupby("method")
        colours = list(dict.fromkeys(method.removeprefix("vote-") for method, _ in curves))
        for method, curve in curves:
            curve = curve.sort_values("N")
            colour = f"C{colours.index(method.removeprefix('vote-'))}"
            ax.plot(curve["N"], curve["accuracy"], _curve_style(method), color=colour, label=method)
            if curve["ci_low"].notna().all():
                ax.fill_between(
                    curve["N"], curve["ci_low"], curve["ci_high"], color=colour, alpha=0.08
                )
        ax.set_xscale("log", base=2)
        ns = sorted(rows.loc[rows["task"] == task, "N"].unique())
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_ylim(0, 1.05)
        ax.set(xlabel="N (samples reranked)", ylabel="accuracy", title=f"{task}: best-of-N")
        ax.legend(fontsize="small")
    return fig


def _curve_style(method: str) -> str:
    """pass@N (the ceiling) and pass@1 dashed, a weighted vote dotted, a selection solid."""
    if method.startswith("pass@"):
        return "o--"
    return "s:" if method.startswith("vote-") else "o-"


def _rounds_figure(rows: pd.DataFrame) -> Figure:
    """pass@1 against round, one line per method, each starting at the SFT row (round 0)."""
    start = rows.iloc[0]
    curves: dict[str, list[tuple[int, Any]]] = {}
    for _, row in rows.iloc[1:].iterrows():
        match = ROUND_POLICY.match(str(row["policy"]))
        if match:
            curves.setdefault(match["method"], [(0, start)]).append((int(match["round"]), row))
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.add_subplot()
    for i, (method, points) in enumerate(curves.items()):
        # methods side by side at each round, so equal values stay visible
        xs = np.array([r for r, _ in points]) + 0.06 * (i - (len(curves) - 1) / 2)
        ys = np.array([p["pass@1"] for _, p in points])
        errors = [ys - [p["ci_low"] for _, p in points], [p["ci_high"] for _, p in points] - ys]
        ax.errorbar(xs, ys, yerr=np.clip(errors, 0, None), fmt="o-", capsize=4, label=method)
        picked = [j for j, (_, p) in enumerate(points) if j and bool(p["selected"])]
        ax.plot(xs[picked], ys[picked], "*", color=f"C{i}", markersize=14)
    ax.axhline(start["pass@1"], color="grey", linewidth=1, linestyle=":")
    ax.set_xticks(sorted({r for points in curves.values() for r, _ in points}))
    ax.set_ylim(0, 1.05)
    ax.set(
        xlabel="round (0: SFT start)",
        ylabel="held-out greedy pass@1 (95% CI)",
        title="Preference rounds (star: the round selection picked)",
    )
    ax.legend(fontsize="small")
    return fig


# ---- readme: the README's results sections (`make readme`, `make readme-tables`) ----
# Each section sits between two marker lines of its own; everything outside them is left as
# it is. The default run's section and config/tables.yaml's are written from the report folder
# of their own run, each by its own command.

BEGIN = "<!-- results: begin (generated by `make readme` from results/report/; do not edit) -->"
END = "<!-- results: end -->"
TABLES_BEGIN = (
    "<!-- results of config/tables.yaml: begin (generated by `make readme-tables` from"
    " results/report/; do not edit) -->"
)
TABLES_END = "<!-- results of config/tables.yaml: end -->"
# What the run's files are called inside results/report/.
SUMMARY, COMPARISONS, CALIBRATION = "summary.csv", "comparisons.json", "calibration.json"


@dataclass(frozen=True)
class ReadmeSection:
    """Where a run's results go in the README: its marker lines and the command writing it."""

    begin: str
    end: str
    command: str


README_SECTIONS = {
    "default": ReadmeSection(BEGIN, END, "make readme"),
    "tables": ReadmeSection(TABLES_BEGIN, TABLES_END, "make readme-tables"),
}


def results_section(
    report_dir: str | Path,
    alpha: float,
    command: str = "make readme",
    declared: list[str] | None = None,
) -> str:
    """The section's Markdown: calibration gates, greedy pass@1 of every policy on every task,
    the declared comparisons (each as its verdict at `alpha`), each from its file in
    report_dir. With `declared` (the config's comparison names), a report whose comparisons
    are not those is refused: it is another config's run."""
    report = Path(report_dir)
    summary = report / SUMMARY
    if not summary.exists():
        raise ReasonRLError(f"{summary}: missing; run the workflow (make run) first")
    parts = [
        f"Generated from `{report.as_posix()}/` by `{command}`.",
        "",
        "Greedy pass@1 on each task's test split (95% bootstrap CI; `summary.csv`):",
        "",
        pass_at_1_table(pd.read_csv(summary)),
    ]
    if (report / CALIBRATION).exists():
        calibration = calibration_table(read_json(report / CALIBRATION))
        parts += ["", "Calibration of the methods' start (`calibration.json`):", "", calibration]
    rows = read_json(report / COMPARISONS) if (report / COMPARISONS).exists() else []
    if declared is not None:
        _check_declared(report / COMPARISONS, [row["name"] for row in rows], declared)
    if rows:
        parts += [
            "",
            f"The declared comparisons (`comparisons.json`; paired on the same problems, Holm"
            f" over all {len(rows)}, alpha {alpha:g}):",
            "",
            comparisons_table(rows, alpha),
        ]
    return "\n".join(part.rstrip("\n") for part in parts) + "\n"


def _check_declared(path: Path, reported: list[str], declared: list[str]) -> None:
    if sorted(reported) != sorted(declared):
        missing = sorted(set(declared) - set(reported)) or "none"
        extra = sorted(set(reported) - set(declared)) or "none"
        raise ReasonRLError(
            f"{path}: its comparisons are not the ones the config declares (declared but not"
            f" reported: {missing}; reported but not declared: {extra})"
        )


def pass_at_1_table(summary: pd.DataFrame) -> str:
    """One row per policy (in the order the summary lists them), one column per task:
    greedy pass@1 [CI]; a task the policy was not evaluated on shows "–"."""
    tasks = list(dict.fromkeys(summary["task"]))
    sizes = summary.groupby("task")["n_problems"].max()
    rows = []
    for policy in dict.fromkeys(summary["policy"]):
        row = {"policy": policy}
        mine = summary[summary["policy"] == policy].set_index("task")
        for task in tasks:
            column = f"{task} ({int(sizes[task])})"
            row[column] = _with_ci(mine.loc[task]) if task in mine.index else "–"
        rows.append(row)
    return markdown(frame(rows))


def comparisons_table(rows: list[dict], alpha: float) -> str:
    shown = [
        {
            "comparison": row["name"],
            "a": row["a"],
            "b": row["b"],
            "n": row["n"],
            "a - b [95% CI]": f"{row['diff']:+.3f} [{row['ci_low']:+.3f}, {row['ci_high']:+.3f}]",
            "p_holm": f"{row['p_holm']:.2g}",
            "verdict": verdict(row, alpha),
        }
        for row in rows
    ]
    return markdown(frame(shown))


def update_readme(
    readme: str | Path, section: str, check: bool = False, markers: ReadmeSection | None = None
) -> bool:
    """Put `section` between the README's markers (the default run's unless `markers` names
    another section's); True when it changed. With check, a section that differs raises
    instead and the file is not written."""
    markers = markers or README_SECTIONS["default"]
    path = Path(readme)
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    begin, end = _marker_lines(path, lines, markers)
    new = "".join(lines[: begin + 1]) + "\n" + section + "\n" + "".join(lines[end:])
    if new == text:
        return False
    if check:
        raise ReasonRLError(
            f"{path}:{begin + 1}: the results section is not the report's; run `{markers.command}`"
        )
    write_text(path, new)
    return True


def _marker_lines(path: Path, lines: list[str], markers: ReadmeSection) -> tuple[int, int]:
    found = {marker: [i for i, line in enumerate(lines) if line.strip() == marker]
             for marker in (markers.begin, markers.end)}  # fmt: skip
    for marker, where in found.items():
        if len(where) != 1:
            raise ReasonRLError(f"{path}: needs the line '{marker}' once, found {len(where)}")
    begin, end = found[markers.begin][0], found[markers.end][0]
    if end < begin:
        raise ReasonRLError(f"{path}:{end + 1}: the end marker comes before the begin marker")
    return begin, end


def _with_ci(row: dict[str, Any] | pd.Series) -> str:
    """Greedy pass@1 with its bootstrap CI, as the summary and the README show it."""
    return f"{row['greedy_pass@1']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"

"""write_report on fake metrics files: files, CSV columns and values, valid PNGs."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from reasonrl.errors import ReasonRLError
from reasonrl.stages.report import report as write_report
from reasonrl.stages.report import report_pages

REPO = Path(__file__).resolve().parents[1]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fake_metrics(policy, task, greedy, ks=(1, 4)):
    metrics = {
        "policy": policy,
        "task": task,
        "style": "tool",
        "n_problems": 20,
        "n_samples": max(ks) if ks else 0,
        "greedy_pass@1": greedy,
        "greedy_pass@1_ci": [max(0.0, greedy - 0.1), min(1.0, greedy + 0.1)],
        "mean_turns": 2.0,
        "mean_tokens": 50.0,
        "finish_reasons": {"answer": 20},
        "tool_status": {"ok": 20},
    }
    for k in ks:
        metrics[f"pass@{k}"] = min(1.0, greedy + 0.05 * k)
        metrics[f"maj@{k}"] = greedy
    return metrics


def write_metrics(tmp_path, metrics, name):
    path = tmp_path / "eval" / name / "metrics.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(metrics))
    return str(path)


def fake_training(tmp_path, name, steps=30):
    history = [
        {"step": s, "loss": 3.0 / s, "lr": 1e-3, "tokens": 100, "seconds": 0.1}
        for s in range(1, steps + 1)
    ]
    path = tmp_path / "train" / name / "metrics.json"
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps({"name": name, "history": history, "final_loss": history[-1]["loss"]})
    )
    return str(path)


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 5_000  # a plot with axes and text, not an empty canvas


@pytest.fixture
def evaluations(tmp_path):
    # deliberately unsorted, and the path names disagree with the keys: keys win
    return [
        write_metrics(tmp_path, fake_metrics("sft-tool", "arith", 0.7), "a"),
        write_metrics(tmp_path, fake_metrics("base", "arith", 0.0), "b"),
        write_metrics(tmp_path, fake_metrics("sft-cot", "arith", 0.4, ks=(1, 4, 8)), "c"),
        write_metrics(tmp_path, fake_metrics("base", "pycode", 0.1, ks=()), "d"),
    ]


def test_write_report_writes_tables_plots_and_index(tmp_path, evaluations):
    out = tmp_path / "report"
    write_report(
        evaluations,
        str(out),
        train_metrics_paths=[
            fake_training(tmp_path, "sft-tool"),
            fake_training(tmp_path, "sft-cot"),
        ],
    )
    for name in ("pass_at_1.png", "pass_at_k.png", "sft_loss.png"):
        assert_png(out / name)
    with open(out / "summary.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == [
        "policy", "task", "n_problems", "n_samples", "greedy_pass@1", "ci_low", "ci_high",
        "pass@1", "pass@4", "pass@8", "maj@1", "maj@4", "maj@8",
    ]  # fmt: skip
    assert [(r["policy"], r["task"]) for r in rows] == [
        ("base", "arith"), ("sft-cot", "arith"), ("sft-tool", "arith"), ("base", "pycode"),
    ]  # fmt: skip
    tool = rows[2]
    assert float(tool["greedy_pass@1"]) == pytest.approx(0.7)
    assert float(tool["ci_low"]) == pytest.approx(0.6)
    assert float(tool["pass@4"]) == pytest.approx(0.9)
    assert tool["pass@8"] == ""  # not measured for this policy
    assert rows[1]["maj@8"] == "0.4"
    summary = (out / "summary.md").read_text()
    assert "| sft-tool | arith | 20 | 4 | 0.700 [0.600, 0.800] |" in summary
    index = (out / "index.md").read_text()
    for name in ("summary.md", "summary.csv", "pass_at_1.png", "pass_at_k.png", "sft_loss.png"):
        assert f"]({name})" in index
    assert summary in index
    assert not list(out.glob(".*.tmp"))  # atomic writes leave no temp files


def test_write_report_without_training_metrics_or_samples(tmp_path):
    paths = [write_metrics(tmp_path, fake_metrics("base", "arith", 0.2, ks=()), "a")]
    out = tmp_path / "report"
    write_report(paths, str(out))
    assert_png(out / "pass_at_1.png")
    assert_png(out / "pass_at_k.png")
    assert not (out / "sft_loss.png").exists()
    assert "sft_loss.png" not in (out / "index.md").read_text()
    with open(out / "summary.csv", newline="") as fh:
        header = next(csv.reader(fh))
    assert not any(c.startswith(("pass@", "maj@")) for c in header)


def test_write_report_names_the_file_and_missing_key(tmp_path):
    metrics = fake_metrics("base", "arith", 0.2)
    del metrics["policy"]
    path = write_metrics(tmp_path, metrics, "a")
    with pytest.raises(ReasonRLError, match=r"a/metrics.json: missing key 'policy'"):
        write_report([path], str(tmp_path / "report"))


def test_write_report_names_the_training_file_without_history(tmp_path, evaluations):
    bad = tmp_path / "train.json"
    bad.write_text(json.dumps({"name": "sft-tool"}))
    with pytest.raises(ReasonRLError, match=r"train.json: missing key 'history'"):
        write_report(evaluations, str(tmp_path / "report"), train_metrics_paths=[str(bad)])


def _write_csv(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return str(path)


def _preference_rows():
    rows = [{"method": "SFT", "policy": "sft-tool", "pass@1": 0.5, "ci_low": 0.4,
             "ci_high": 0.6, "n_problems": 50, "selected": False}]  # fmt: skip
    for method in ("mdpo", "mkto"):
        for r in (1, 2):
            rows.append(
                {"method": f"{method} round {r}", "policy": f"{method}-round{r}",
                 "pass@1": 0.5 + 0.05 * r, "ci_low": 0.4 + 0.05 * r, "ci_high": 0.6 + 0.05 * r,
                 "n_problems": 50, "selected": r == 2}
            )  # fmt: skip
    return rows


def _best_of_n_rows():
    return [
        {"task": "arith", "N": n, "method": method, "accuracy": 0.5 + 0.02 * n * (i + 1),
         "ci_low": 0.4, "ci_high": 0.9}
        for n in (1, 2, 4)
        for i, method in enumerate(("prm", "orm", "majority"))
    ]  # fmt: skip


def test_report_pages_writes_a_page_per_table_and_the_curves(tmp_path):
    from best_of_n_files import write_best_of_n

    preference = _write_csv(tmp_path / "preference.csv", _preference_rows())
    best_of_n = _write_csv(tmp_path / "best_of_n.csv", _best_of_n_rows())
    out = tmp_path / "pages"
    tables = {"preference": preference, "best_of_n": best_of_n}
    folder = write_best_of_n(tmp_path / "search/arith/best-of-n")
    report_pages(tables, str(out), {"arith": str(folder)}, preference)
    page = (out / "tables" / "preference.html").read_text()
    assert page.count("<tr") == 1 + len(_preference_rows())  # header + one row each
    assert "mkto-round2" in page and "<th>ci_high</th>" in page
    pages = sorted(p.name for p in (out / "tables").iterdir())
    assert pages == ["best_of_n.html", "preference.html"]
    for name in ("best_of_n.png", "rounds.png"):
        assert (out / name).read_bytes().startswith(PNG_MAGIC)


def test_best_of_n_curves_run_over_powers_of_two_up_to_the_samples_drawn(tmp_path):
    from best_of_n_files import groups_by_hand, write_best_of_n

    from reasonrl.search import best_of_n_metrics

    folder = write_best_of_n(tmp_path / "search/arith/best-of-n")
    report_pages({}, str(tmp_path / "pages"), {"arith": str(folder)})
    rows = json.loads((tmp_path / "pages" / "best_of_n_curves.json").read_text())
    methods = {"pass@1", "pass@N", "maj@N", "vote-orm@N", "vote-prm-min@N", "orm@N", "prm-min@N"}
    assert {(row["task"], row["method"], row["N"]) for row in rows} == {
        ("arith", method, n) for method in methods for n in (1, 2, 4)
    }
    # The same numbers as the best-of-N table's code on the same samples, at every N.
    table = best_of_n_metrics(groups_by_hand(), [1, 2, 4], ["orm", "prm-min"])
    assert [{k: v for k, v in row.items() if k != "task"} for row in rows] == table["rows"]
    by_key = {(row["method"], row["N"]): row["accuracy"] for row in rows}
    assert by_key["pass@N", 4] == 0.75 and by_key["maj@N", 4] == 0.375  # the ceiling, the vote
    # weighted by the ORM: right on p0 (1.4 for "3") and p1 (0.8 for "6"), a 0.5-0.5 tie on p3
    assert by_key["vote-orm@N", 4] == 0.625
    csv_text = (tmp_path / "pages" / "best_of_n_curves.csv").read_text()
    assert csv_text.startswith("task,N,method,accuracy,ci_low,ci_high")
    assert (tmp_path / "pages" / "best_of_n.png").read_bytes().startswith(PNG_MAGIC)


def test_report_pages_names_an_unreadable_table(tmp_path):
    missing = tmp_path / "no-such.csv"
    with pytest.raises(ReasonRLError, match=r"no-such\.csv: unreadable table"):
        report_pages({"summary": str(missing)}, str(tmp_path / "pages"))


def test_index_shows_the_calibration_gates_when_given(tmp_path):
    from reasonrl.config import validate_config
    from reasonrl.stages.calibration import calibrate

    rows = []
    for i, (greedy, samples) in enumerate([(True, [True, False]), (False, [False, False])]):
        rows.append({"problem_id": f"p{i}", "decoding": "greedy", "correct": greedy})
        rows += [{"problem_id": f"p{i}", "decoding": "sampled", "correct": c} for c in samples]
    trajectories = tmp_path / "trajectories.jsonl"
    trajectories.write_text("".join(json.dumps(row) + "\n" for row in rows))
    raw = {"calibration": {"frontier_task": "arith", "k": 2}, "evaluation": {"temperature": 0.7}}
    config = validate_config(raw, stage=True)
    temperatures = {"preference.sampling.temperature": 1.0}
    calibrate(config, str(trajectories), str(trajectories), temperatures, str(tmp_path / "cal"))
    metrics = [write_metrics(tmp_path, fake_metrics("sft-tool", "arith", 0.5), "sft")]
    out = tmp_path / "report"
    write_report(metrics, str(out), calibration_path=str(tmp_path / "cal" / "calibration.json"))
    index = (out / "index.md").read_text()
    assert (
        "Calibration of sft-tool (easy: arith, frontier: arith, 2 problems x 2 samples at" in index
    )
    assert "differs from preference.sampling.temperature = 1.0" in index
    assert "| easy_min | easy_greedy | 0.500 | >= 0.85 | FAILED |" in index
    assert "| frontier_max | frontier_greedy | 0.500 | <= 0.6 | passed |" in index


# ---- the README's results section (make readme) ----

README = "# title\n\nabove\n\n{begin}\nstale\n{end}\n\nbelow\n"


def comparison_row(name, diff, ci, p_holm, **extra):
    return {
        "name": name, "metric": "greedy_pass@1", "a": "a-pol", "b": "sft-tool", "n": 20,
        "value_a": 0.7 + diff, "value_b": 0.7, "diff": diff, "ci_low": ci[0], "ci_high": ci[1],
        "test": "mcnemar_exact", "p": p_holm, "p_holm": p_holm, **extra,
    }  # fmt: skip


@pytest.fixture
def report_dir(tmp_path, evaluations):
    out = tmp_path / "report"
    write_report(evaluations, str(out))
    rows = [
        comparison_row("gain", 0.1, (0.05, 0.15), 0.001),
        comparison_row("null", -0.02, (-0.08, 0.04), 1.0),
        comparison_row("cost", -0.01, (-0.02, 0.0), 0.004, margin=0.03),
    ]
    (out / "comparisons.json").write_text(json.dumps(rows))
    return out


def test_readme_section_tables_every_policy_by_task_and_each_comparisons_verdict(report_dir):
    from reasonrl.stages.report import results_section

    section = results_section(report_dir, alpha=0.05)
    # one row per policy, a column per task with its problem count; no pycode run is a dash
    assert "| policy | arith (20) | pycode (20) |" in section
    assert "| sft-tool | 0.700 [0.600, 0.800] | – |" in section
    assert "| base | 0.000 [0.000, 0.100] | 0.100 [0.000, 0.200] |" in section
    assert "| gain | a-pol | sft-tool | 20 | +0.100 [+0.050, +0.150] | 0.001 | a > b |" in section
    null = "| null | a-pol | sft-tool | 20 | -0.020 [-0.080, +0.040] | 1 | no difference shown |"
    assert null in section
    assert "| 0.004 | a >= b - 0.03 |" in section
    assert "Holm over all 3, alpha 0.05" in section
    assert "Calibration" not in section  # no calibration.json in this report


def test_readme_update_rewrites_only_between_the_markers_and_check_refuses_a_stale_one(
    report_dir, tmp_path
):
    from reasonrl.stages.report import BEGIN, END, results_section, update_readme

    readme = tmp_path / "README.md"
    readme.write_text(README.format(begin=BEGIN, end=END))
    section = results_section(report_dir, alpha=0.05)
    with pytest.raises(ReasonRLError, match=r"README.md:5: the results section is not the report"):
        update_readme(readme, section, check=True)
    assert "stale" in readme.read_text()  # check wrote nothing
    assert update_readme(readme, section) is True
    text = readme.read_text()
    assert text.startswith("# title\n\nabove\n\n" + BEGIN + "\n\n" + section)
    assert text.endswith(section + "\n" + END + "\n\nbelow\n") and "stale" not in text
    assert update_readme(readme, section) is False  # idempotent
    assert update_readme(readme, section, check=True) is False
    assert readme.read_text() == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no markers\n", "needs the line '<!-- results: begin"),
        ("{begin}\n{begin}\n{end}\n", "found 2"),
        ("{end}\n{begin}\n", "README.md:1: the end marker comes before the begin marker"),
    ],
)
def test_readme_update_names_the_file_and_its_bad_markers(tmp_path, text, message):
    from reasonrl.stages.report import BEGIN, END, update_readme

    readme = tmp_path / "README.md"
    readme.write_text(text.format(begin=BEGIN, end=END))
    with pytest.raises(ReasonRLError, match=re.escape(message)):
        update_readme(readme, "section\n")


def test_readme_section_of_a_folder_without_a_run_says_to_run_it(tmp_path):
    from reasonrl.stages.report import results_section

    with pytest.raises(ReasonRLError, match=r"summary.csv: missing; run the workflow"):
        results_section(tmp_path, alpha=0.05)


def test_the_readme_holds_one_results_section_that_make_readme_writes():
    from reasonrl.stages.report import README_SECTIONS

    lines = (Path(__file__).resolve().parents[1] / "README.md").read_text().splitlines()
    for section in README_SECTIONS.values():
        assert lines.count(section.begin) == 1 and lines.count(section.end) == 1
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert "readme: setup\n\t$(BIN)/reasonrl readme --config $(CONFIG)\n" in makefile
    tables = "\t$(BIN)/reasonrl readme --section tables --configfile config/tables.yaml\n"
    assert "readme-tables: setup\n" + tables in makefile


def test_readme_section_refuses_a_report_of_another_configs_run(report_dir):
    """`make readme-tables` after a default run would put the default's numbers under the
    tables' heading: the report's comparisons must be the config's declared ones."""
    from reasonrl.stages.report import results_section

    section = results_section(report_dir, 0.05, declared=["cost", "gain", "null"])
    assert "| gain |" in section
    message = r"comparisons.json: its comparisons are not the ones the config declares \("
    message += r"declared but not reported: \['grpo_vs_sft'\]; reported but not declared:"
    message += r" \['cost'\]\)"
    with pytest.raises(ReasonRLError, match=message):
        results_section(report_dir, 0.05, declared=["gain", "null", "grpo_vs_sft"])


def test_each_readme_section_is_written_between_its_own_markers_by_its_own_command(
    report_dir, tmp_path
):
    from reasonrl.stages.report import README_SECTIONS, results_section, update_readme

    default, tables = README_SECTIONS["default"], README_SECTIONS["tables"]
    readme = tmp_path / "README.md"
    text = f"{default.begin}\nold default\n{default.end}\n\n{tables.begin}\nold\n{tables.end}\n"
    readme.write_text(text)
    section = results_section(report_dir, 0.05, command=tables.command)
    assert section.startswith(f"Generated from `{report_dir.as_posix()}/` by `make readme-tables`")
    with pytest.raises(ReasonRLError, match=r"README.md:5: .* run `make readme-tables`"):
        update_readme(readme, section, check=True, markers=tables)
    assert update_readme(readme, section, markers=tables) is True
    written = readme.read_text()
    assert written.startswith(f"{default.begin}\nold default\n{default.end}\n")  # kept
    assert written.endswith(f"{tables.begin}\n\n{section}\n{tables.end}\n")


def test_the_readme_commands_section_choices_are_the_sections():
    from reasonrl.cli import _parser
    from reasonrl.stages.report import README_SECTIONS

    readme = _parser()._subparsers._group_actions[0].choices["readme"]
    section = next(action for action in readme._actions if action.dest == "section")
    assert set(section.choices) == set(README_SECTIONS)


def test_readme_tables_refuses_the_default_runs_report(report_dir, tmp_path):
    """`make readme-tables` (reasonrl readme --section tables --configfile
    config/tables.yaml) on a report of other comparisons: one line, the README untouched."""
    from reasonrl.stages.report import README_SECTIONS

    tables = README_SECTIONS["tables"]
    readme = tmp_path / "README.md"
    readme.write_text(f"{tables.begin}\nold\n{tables.end}\n")
    reasonrl = Path(sys.executable).parent / "reasonrl"
    command = [str(reasonrl), "readme", "--section", "tables", "--configfile"]
    command += [str(REPO / "config/tables.yaml"), "--report-dir", str(report_dir)]
    result = subprocess.run(
        [*command, "--readme", str(readme)], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode != 0
    assert "comparisons.json: its comparisons are not the ones the config declares" in (
        result.stderr
    )
    assert "'grpo_vs_sft'" in result.stderr and readme.read_text().endswith(
        "old\n" + tables.end + "\n"
    )

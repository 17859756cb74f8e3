"""Preference stage CLIs: config checks, bad inputs named in one line, selection and table."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
import yaml

from reasonrl.config import validate_config
from reasonrl.errors import ReasonRLError
from reasonrl.io import read_json, write_json, write_jsonl
from reasonrl.stages.preference import _read_reference, select_best, variant_settings
from reasonrl.stages.preference import preference_table as write_table


def reasonrl(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "reasonrl.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True)


def test_variant_defaults_are_filled_and_names_checked():
    config = validate_config({"preference": {"variants": [{"name": "a", "loss": "mkto"}]}})
    variant = variant_settings(config, "a")
    assert variant["beta"] == 0.1 and variant["reference"] == "previous" and variant["rounds"] == 3
    with pytest.raises(ReasonRLError, match="'b' is not in preference.variants"):
        variant_settings(config, "b")
    with pytest.raises(ReasonRLError, match="repeats 'a'"):
        validate_config({"preference": {"variants": [{"name": "a"}, {"name": "a"}]}})
    with pytest.raises(ReasonRLError, match="reserved"):
        validate_config({"preference": {"variants": [{"name": "x-round2"}]}})
    with pytest.raises(ReasonRLError, match="unknown config key 'preference.variants.0.betta'"):
        validate_config({"preference": {"variants": [{"name": "a", "betta": 0.1}]}})
    with pytest.raises(ReasonRLError, match="'preference.task' names 'gsm8k'"):
        validate_config({"tasks": {"arith": {"kind": "arith"}}, "preference": {"task": "gsm8k"}})
    sources = {"prompts": {"sources": ["metamath"]}}
    with pytest.raises(ReasonRLError, match="'preference.prompts.sources' names 'metamath', wh"):
        validate_config({"tasks": {"arith": {"kind": "arith"}}, "preference": sources})


def test_cached_reference_must_belong_to_the_training_rows(tmp_path):
    rows = [{"problem_id": "a"}, {"problem_id": "b"}]
    path = tmp_path / "reference.jsonl"
    write_jsonl(path, [{"index": 0, "problem_id": "a", "logps": [-1.0, -2.0]}])
    with pytest.raises(ReasonRLError, match="1 rows, but the training data has 2"):
        _read_reference(str(path), rows, paired=True)
    write_jsonl(
        path,
        [
            {"index": 0, "problem_id": "a", "logps": [-1.0, -2.0]},
            {"index": 1, "problem_id": "c", "logps": [-1.0, -2.0]},
        ],
    )
    with pytest.raises(ReasonRLError, match="reference.jsonl:2: does not belong"):
        _read_reference(str(path), rows, paired=True)
    write_jsonl(
        path,
        [
            {"index": 0, "problem_id": "a", "logps": [-1.0]},
            {"index": 1, "problem_id": "b", "logps": [-3.0]},
        ],
    )
    assert _read_reference(str(path), rows, paired=False) == [-1.0, -3.0]
    with pytest.raises(ReasonRLError, match="expected 2 log-probs"):
        _read_reference(str(path), rows, paired=True)


def test_sampler_argument_errors_are_one_line(tmp_path):
    result = reasonrl(
        "sample-round", "--prompts", "p.jsonl", "--sampler", "sft-tool:4", "--round", "1",
        "--out-dir", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 2
    expected = "reasonrl: error: --sampler expects NAME=VALUE, got 'sft-tool:4'"
    assert result.stderr.strip() == expected


def test_missing_labelled_data_is_named(tmp_path):
    result = reasonrl(
        "label-preferences", "--samples", str(tmp_path / "none.jsonl"), "--round", "1",
        "--out-dir", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 2 and "none.jsonl: file not found" in result.stderr


def _metrics(path, policy: str, value: float, ci: list[float]) -> str:
    write_json(path, {"policy": policy, "greedy_pass@1": value, "greedy_pass@1_ci": ci,
                      "n_problems": 100})  # fmt: skip
    return str(path)


def test_best_round_is_the_highest_selection_accuracy_earliest_on_ties(tmp_path):
    paths = [
        _metrics(tmp_path / f"{p}.json", p, v, [v - 0.1, v + 0.1])
        for p, v in [("sft-tool", 0.5), ("m-round1", 0.7), ("m-round2", 0.7), ("m-round3", 0.6)]
    ]
    result = select_best(paths, str(tmp_path / "best"))
    assert result["best"] == "m-round1"
    assert read_json(tmp_path / "best/best.json")["best"] == "m-round1"
    assert (tmp_path / "best/best.csv").read_text().count("True") == 1


def test_table_marks_selected_rounds_and_cis_above_sft(tmp_path):
    rows = [
        ("SFT", "sft-tool", _metrics(tmp_path / "s.json", "sft-tool", 0.5, [0.4, 0.6])),
        ("M-DPO round 1", "m-round1", _metrics(tmp_path / "1.json", "m-round1", 0.6, [0.5, 0.7])),
        ("M-DPO round 2", "m-round2", _metrics(tmp_path / "2.json", "m-round2", 0.8, [0.7, 0.9])),
    ]
    write_json(tmp_path / "best.json", {"best": "m-round2", "rounds": []})
    table = write_table(rows, [str(tmp_path / "best.json")], str(tmp_path / "out"))
    assert [r["ci_above_baseline"] for r in table] == [False, False, True]
    assert [r["selected"] for r in table] == [False, False, True]
    markdown = (tmp_path / "out/table.md").read_text()
    assert "| M-DPO round 2 | m-round2 | 0.8 | 0.7 | 0.9 | 100 | True | True |" in markdown
    assert json.loads(json.dumps(table))  # plain values, written as CSV too
    assert (tmp_path / "out/table.csv").is_file()


def test_table_rows_keep_labels_with_equals_signs():
    from reasonrl.cli import table_row

    row = "M-DPO eta=0.5=mdpo-eta0.5-round1:results/eval/mdpo-eta0.5-round1/arith/metrics.json"
    assert table_row(row, "LABEL=POLICY:METRICS") == (
        "M-DPO eta=0.5",
        "mdpo-eta0.5-round1",
        "results/eval/mdpo-eta0.5-round1/arith/metrics.json",
    )
    with pytest.raises(ReasonRLError, match="--row expects LABEL=POLICY:METRICS"):
        table_row("no separators", "LABEL=POLICY:METRICS")


def test_rounds_start_from_the_sft_policy_the_config_names(snakemake, tmp_path):
    """With only a CoT SFT policy the rounds sample, train from and are selected as sft-cot,
    in its style; the default round 0 (sft-tool) is then one line naming the key."""
    cot_only = {
        "sft": {"variants": ["cot"]},
        "preference": {
            "policy": "sft-cot",
            "variants": [{"name": "m", "rounds": 2}],
            "sampling": {"latest": 4, "previous": 2},
        },
        "reward_models": {"tasks": []},
        "comparisons": {"declared": []},
        # the default's calibration, online DPO and PPO start from sft-tool, which this config
        # lacks
        "calibration": {"frontier_task": None},
        "online_dpo": {"variants": []},
        "ppo": {"variants": []},
    }
    path = tmp_path / "cot.yaml"
    path.write_text(yaml.safe_dump(cot_only))
    result = snakemake("-n", "-p", "--configfile", str(path))
    commands = [
        shlex.split(line.removeprefix("Shell command: "))
        for line in result.stdout.splitlines()
        if line.startswith("Shell command: reasonrl ")
    ]

    def calls(verb):
        return [argv for argv in commands if argv[1] == verb]

    def flag(argv, name):
        return argv[argv.index(name) + 1]

    samplers = [flag(argv, "--sampler") for argv in calls("sample-round")]
    assert "sft-cot=results/models/sft-cot:4" in samplers
    assert {flag(argv, "--style") for argv in calls("sample-round")} == {"cot"}
    trains = {flag(argv, "--out"): flag(argv, "--model") for argv in calls("preference-train")}
    assert trains["results/models/m-round1"] == "results/models/sft-cot"
    selections = [
        argv for argv in calls("evaluate") if "results/selection/" in flag(argv, "--out-dir")
    ]
    assert {flag(argv, "--policy") for argv in selections} == {"sft-cot", "m-round1", "m-round2"}
    assert {flag(argv, "--style") for argv in selections} == {"cot"}
    tests = [
        argv for argv in calls("evaluate") if flag(argv, "--model") == "results/models/m-round2"
    ]
    assert tests and {flag(argv, "--style") for argv in tests} == {"cot"}

    del cot_only["preference"]["policy"]
    path.write_text(yaml.safe_dump(cot_only))
    result = snakemake("-n", "--configfile", str(path), check=False)
    assert result.returncode != 0
    assert (
        "config key 'preference.policy' names 'sft-tool', which is not an SFT policy of"
        " sft.variants (sft-cot)" in result.stderr
    )
    assert "KeyError" not in result.stderr


def test_sample_round_prompts_in_the_style_it_is_given(tiny_policy, tmp_path):
    from reasonrl.stages.preference import sample_round
    from reasonrl.tasks import build_problems, prompt_messages

    config = validate_config({"generation": {"batch_size": 2}, "rollout": {"max_turns": 1}})
    config["rollout"]["max_turn_tokens"] = 4
    problems = build_problems("arith", {"kind": "arith", "train_size": 2, "test_size": 0}, 0)[0]
    write_jsonl(tmp_path / "p.jsonl", problems)
    samplers = [("sft-cot", str(tiny_policy), 1)]
    for style in ("cot", "tool"):
        out = tmp_path / style
        sample_round(config, str(tmp_path / "p.jsonl"), samplers, 1, str(out), style)
        rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
        expected = {json.dumps(prompt_messages(p, style), sort_keys=True) for p in problems}
        prompts = {
            json.dumps(r["messages"][: len(prompt_messages(problems[0], style))], sort_keys=True)
            for r in rows
        }
        assert prompts == expected

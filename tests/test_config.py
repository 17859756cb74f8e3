"""Config validation: unknown keys named, defaults filled, shipped configs valid."""

from __future__ import annotations

import json
import re
from importlib.metadata import distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from reasonrl.config import (
    load_config,
    load_workflow_config,
    named_tasks,
    sft_policies,
    validate_config,
)
from reasonrl.errors import ReasonRLError
from reasonrl.io import load_schema

SHIPPED = sorted((Path(__file__).resolve().parents[1] / "config").glob("*.yaml"))


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"sedd": 1}, "sedd"),
        ({"sft": {"max_stepz": 3}}, "sft.max_stepz"),
        ({"tasks": {"arith": {"kind": "arith", "sizes": 3}}}, "tasks.arith.sizes"),
        ({"policy": {"tiny": {"layers": 2}}}, "policy.tiny.layers"),
    ],
)
def test_unknown_key_is_named(raw, key):
    with pytest.raises(ReasonRLError, match=f"unknown config key '{key}'") as err:
        validate_config(raw, "my.yaml")
    assert str(err.value).startswith("my.yaml: ")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"preference": {"variants": [{"name": "mdpo", "eta": 0.1}]}}, "preference.variants.0.eta"),
        ({"ppo": {"kl_beta": 0.05}}, "ppo.kl_beta"),
    ],
)
def test_a_renamed_key_is_refused_with_its_new_name(raw, key):
    with pytest.raises(ReasonRLError) as err:
        validate_config(raw, "my.yaml")
    assert str(err.value) == (
        f"my.yaml: config key '{key}' is now 'beta' (one name for the KL coefficient in every"
        " method)"
    )


def test_the_kl_coefficient_is_beta_in_every_method():
    config = validate_config({"preference": {"variants": [{"name": "mdpo"}]}})
    assert config["preference"]["variants"][0]["beta"] == 0.1
    assert config["online_dpo"]["beta"] == 0.05 and config["ppo"]["beta"] == 0.05


def test_defaults_are_filled_around_given_values():
    schema = load_schema("config")["properties"]
    config = validate_config({"sft": {"lr": 0.5}})
    assert config["sft"]["lr"] == 0.5
    assert config["sft"]["max_steps"] == schema["sft"]["properties"]["max_steps"]["default"]
    arith = schema["tasks"]["additionalProperties"]["properties"]
    assert config["tasks"]["arith"]["kind"] == "arith"
    assert config["tasks"]["arith"]["train_size"] == arith["train_size"]["default"]
    assert set(config) == set(schema)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_config_validates(path):
    config = load_config(path)
    assert set(config["sft"]["tasks"]) <= set(config["tasks"])
    assert set(config["evaluation"]["tasks"]) <= set(config["tasks"])


def test_snakemake_names_unknown_key_in_one_line(snakemake, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("sft:\n  max_stepz: 3\n")
    result = snakemake("-n", "--configfile", str(bad), check=False)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, result.stderr
    assert "unknown config key 'sft.max_stepz'" in errors[0]
    assert str(bad) in errors[0]
    assert "Traceback" not in result.stderr + result.stdout


def schema_keys(schema: dict, prefix: str = "") -> dict[str, object]:
    """Every leaf key of the config schema (task settings as tasks.NAME.*) -> its default."""
    keys: dict[str, object] = {}
    for name, sub in schema.get("properties", {}).items():
        if "properties" in sub:
            keys.update(schema_keys(sub, f"{prefix}{name}."))
        elif isinstance(sub.get("additionalProperties"), dict):
            keys[f"{prefix}{name}"] = sub.get("default")
            keys.update(schema_keys(sub["additionalProperties"], f"{prefix}{name}.NAME."))
        else:
            keys[f"{prefix}{name}"] = sub.get("default", "required")
    return keys


def test_config_readme_documents_every_key_with_its_default():
    readme = (SHIPPED[0].parent / "README.md").read_text(encoding="utf-8")
    rows = {
        line.split("|")[1].strip(" `"): line.split("|")[3].strip(" `")
        for line in readme.splitlines()
        if line.startswith("| `")
    }
    for key, default in schema_keys(load_schema("config")).items():
        assert key in rows, f"config/README.md lacks {key}"
        expected = default if default == "required" else json.dumps(default)
        assert rows[key] == expected, f"config/README.md: {key} default {rows[key]} != {expected}"


def test_sft_entries_name_policies_with_their_own_style_tasks_and_steps():
    config = validate_config(
        {
            "tasks": {"arith": {"kind": "arith"}, "pycode": {"kind": "pycode"}},
            "sft": {"variants": ["cot", {"name": "code", "tasks": ["pycode"], "max_steps": 9}]},
        }
    )
    assert sft_policies(config) == {
        "cot": {"style": "cot", "tasks": ["arith"], "max_steps": 800, "own_tasks": False},
        "code": {"style": "tool", "tasks": ["pycode"], "max_steps": 9, "own_tasks": True},
    }


@pytest.mark.parametrize(
    ("sft", "message"),
    [
        ({"variants": [{"name": "code", "tasks": ["gsm8k"]}]}, "'sft.variants.code.tasks' names"),
        ({"variants": ["tool", {"name": "tool", "style": "cot"}]}, "'sft.variants' repeats 'tool'"),
        ({"variants": [{"name": "Code"}]}, "config key 'sft.variants.0'"),
    ],
)
def test_bad_sft_entries_are_named(sft, message):
    with pytest.raises(ReasonRLError, match=message):
        validate_config({"sft": sft}, "my.yaml")


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ({"reward_models": {"tasks": ["arith", "pycode"]}}, "reward_models.tasks"),
        ({"evaluation": {"tasks": ["arith"]}}, "evaluation.tasks"),
        ({"sft": {"tasks": ["arith"]}}, "sft.tasks"),
    ],
)
def test_a_stage_config_holds_only_its_own_task(section, key):
    # A rule passes the tasks section reduced to its task (config_json(..., task=...)), e.g.
    # the evaluation of the pycode policy while evaluation.tasks lists arith.
    raw = {"tasks": {"pycode": {"kind": "pycode"}}, **section}
    validate_config(raw, "--config-json", stage=True)
    with pytest.raises(ReasonRLError, match=f"'{key}' names 'arith'"):
        validate_config(raw, "my.yaml")


def test_reward_model_task_policies_must_name_reward_model_tasks():
    raw = {"reward_models": {"tasks": ["arith"], "task_policies": {"pycode": "sft-code"}}}
    with pytest.raises(ReasonRLError, match="'reward_models.task_policies' names 'pycode'"):
        validate_config(raw, "my.yaml")


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ({"tasks": {"arith": {"kind": "arith"}, "arith3": {"kind": "arith"}},
          "reward_models": {"tasks": ["arith", "arith3"], "pooled": True,
                            "task_policies": {"arith3": "sft-cot"}}},
         "'reward_models.pooled': its tasks' reward models start from different policies "
         "(sft-cot, sft-tool)"),
        ({"tasks": {"arith": {"kind": "arith"}, "pycode": {"kind": "pycode"}},
          "reward_models": {"tasks": ["arith", "pycode"], "pooled": True}},
         "'reward_models.pooled': reward_models.tasks mixes code and math tasks"),
        ({"tasks": {"a+b": {"kind": "arith"}}}, "'tasks': 'a+b' does not match"),
    ],
)  # fmt: skip
def test_pooled_reward_models_share_a_policy_and_a_label_kind(raw, error):
    with pytest.raises(ReasonRLError, match=re.escape(error)):
        validate_config(raw, "my.yaml")
    tasks = {"arith": {"kind": "arith"}, "arith3": {"kind": "arith"}}
    validate_config({"tasks": tasks, "reward_models": {"tasks": ["arith", "arith3"],
                                                       "pooled": True}}, "my.yaml")  # fmt: skip


ARITH3 = {"arith3": {"kind": "arith", "min_ops": 3, "max_ops": 3}}
PPO = {"task": "arith3", "variants": [{"name": "m", "filter": "ppo-m"}]}
ONLINE = {"task": "arith3", "reward": "oracle", "variants": [{"name": "async"}]}


@pytest.mark.parametrize(
    ("raw", "key", "policy"),
    [
        ({"online_dpo": {**ONLINE, "policy": "sft-mix"}}, "online_dpo.policy", "sft-mix"),
        ({"ppo": {**PPO, "policy": "sft-nope"}}, "ppo.policy", "sft-nope"),
        ({"reward_models": {"tasks": ["arith"], "policy": "sft"}}, "reward_models.policy", "sft"),
        (
            {"reward_models": {"tasks": ["arith"], "task_policies": {"arith": "sft-code"}}},
            "reward_models.task_policies.arith",
            "sft-code",
        ),
        # PPO's R^2 table reads its task's BT-RM: reward_models.policy samples it
        ({"ppo": PPO, "reward_models": {"policy": "sft-x"}}, "reward_models.policy",
         "sft-x"),
    ],
)  # fmt: skip
def test_start_policies_must_be_trained_sft_policies(raw, key, policy):
    """A section with work to do starts from an SFT policy of sft.variants (before, a wrong
    name was a KeyError in the DAG's input functions)."""
    raw = {"tasks": {"arith": {"kind": "arith"}, **ARITH3}, **raw}
    message = f"my.yaml: config key '{key}' names '{policy}', which is not an SFT policy of"
    with pytest.raises(ReasonRLError, match=re.escape(message)) as err:
        validate_config(raw, "my.yaml")
    assert "\n" not in str(err.value)


def test_start_policies_of_sections_with_nothing_to_run_are_not_checked():
    tasks = {"arith": {"kind": "arith"}, **ARITH3}
    online_dpo = {"task": "arith3", "policy": "sft-mix"}
    online = validate_config({"tasks": tasks, "online_dpo": online_dpo})
    assert online["online_dpo"]["policy"] == "sft-mix"
    assert online["online_dpo"]["variants"] == [], "the section has no work to do"
    ppo = validate_config({"tasks": tasks, "ppo": {**PPO, "policy": "base"}})
    assert ppo["ppo"]["policy"] == "base"
    # reward models nobody uses: no reward_models.tasks, no PPO variant
    unused = validate_config({"ppo": {"task": "arith3"}, "reward_models": {"policy": "sft-x"}})
    assert unused["reward_models"]["policy"] == "sft-x"
    assert unused["reward_models"]["tasks"] == [] and unused["ppo"]["variants"] == []


def test_task_lists_must_name_configured_tasks():
    with pytest.raises(ReasonRLError, match="'evaluation.tasks' names 'gsm8k'"):
        validate_config({"evaluation": {"tasks": ["gsm8k"]}}, "my.yaml")
    with pytest.raises(ReasonRLError, match="'policy.tiny.tokenizer_tasks' names 'pycode'"):
        validate_config({"policy": {"tiny": {"tokenizer_tasks": ["pycode"]}}}, "my.yaml")


def test_online_dpo_task_must_be_configured_when_a_variant_runs():
    raw = {"tasks": {"arith": {"kind": "arith"}}, "online_dpo": {"task": "arith3"}}
    validate_config(raw, "my.yaml")  # no variant: nothing reads the task
    raw["online_dpo"]["variants"] = [{"name": "async"}]
    with pytest.raises(ReasonRLError, match="'online_dpo.task' names 'arith3'"):
        validate_config(raw, "my.yaml")


def test_the_calibration_policy_must_be_sampled():
    raw = {
        "tasks": {"arith": {"kind": "arith"}, "arith3": {"kind": "arith"}},
        "evaluation": {"n_samples": 8, "temperature": 0.7, "sampled_policies": ["sft-tool"]},
        "calibration": {"frontier_task": "arith3"},
    }
    validate_config(raw, "my.yaml")
    raw["evaluation"]["sampled_policies"] = ["sft-cot"]
    with pytest.raises(ReasonRLError, match="'evaluation.sampled_policies' leaves out 'sft-tool'"):
        validate_config(raw, "my.yaml")


def test_a_json_config_file_keeps_its_numbers(tmp_path):
    """JSON writes 3e-05 without a dot, which YAML 1.1 would read as a string."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"preference": {"train": {"lr": 3e-05}}}))
    assert load_config(path)["preference"]["train"]["lr"] == 3e-05


def test_a_config_file_naming_tasks_replaces_the_defaults_task_set(tmp_path):
    default = tmp_path / "default.yaml"
    default.write_text(
        "tasks: {arith: {kind: arith, max_ops: 2}, arith3: {kind: arith, min_ops: 3}}\n"
        "sft: {max_steps: 9}\n"
    )
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("tasks: {arith: {kind: arith, train_size: 5}}\n")
    steps = tmp_path / "steps.yaml"
    steps.write_text("sft: {max_steps: 3}\n")
    config = load_workflow_config([str(recipe), str(steps)], default=str(default))
    assert list(config["tasks"]) == ["arith"]
    # the default's arith settings are not merged in: the schema's fill the rest
    assert (config["tasks"]["arith"]["train_size"], config["tasks"]["arith"]["max_ops"]) == (5, 4)
    assert config["sft"]["max_steps"] == 3  # every other section merges
    files = [str(default), str(recipe), str(steps)]
    assert named_tasks(files, {}) == {"arith": {"kind": "arith", "train_size": 5}}
    edited = named_tasks(files, {"tasks": {"arith": {"test_size": 7}}})
    assert edited == {"arith": {"kind": "arith", "train_size": 5, "test_size": 7}}
    assert named_tasks([str(steps)], {}) is None


def test_conda_env_pins_what_the_lock_pins():
    root = Path(__file__).resolve().parents[1]
    lock = {
        line.replace("+cpu", "")
        for line in (root / "envs/lock-cpu.txt").read_text().splitlines()
        if line and not line.startswith("#")
    }
    conda = {
        line.strip().removeprefix("- ")
        for line in (root / "envs/conda-cpu.yaml").read_text().splitlines()
        if line.startswith("      - ")
    }
    assert conda == lock


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_cpu_lock_holds_every_requirement_of_what_it_pins():
    """The CPU image installs envs/lock-cpu.txt from a wheel folder with --no-index: a
    dependency the lock forgets (statsmodels -> formulaic) fails the image build, not .venv."""
    root = Path(__file__).resolve().parents[1]
    lines = (root / "envs/lock-cpu.txt").read_text().splitlines()
    locked = {_normalized(line.split("==")[0]) for line in lines if "==" in line}
    missing = set()
    for name in locked:
        for text in distribution(name).requires or []:
            requirement = Requirement(text)
            if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
                continue
            if _normalized(requirement.name) not in locked:
                missing.add(f"{name} -> {requirement.name}")
    assert not missing, sorted(missing)


def test_reduced_stage_config_does_not_check_sections_it_lacks():
    config = validate_config({"tasks": {"pycode": {"kind": "pycode"}}}, "--config-json")
    assert config["sft"]["tasks"] == ["arith"]  # a default, not a reference to check


def test_sft_stage_config_may_name_tasks_it_is_not_given():
    """The sft rule passes sft and policy only; tables.yaml's sft.tasks [arith, pycode]
    failed there against the default tasks section (the task list is checked on the whole
    config)."""
    stage = json.dumps({"sft": {"tasks": ["arith", "pycode"]}, "policy": {}})
    assert load_config(json_text=stage)["sft"]["tasks"] == ["arith", "pycode"]


def test_reward_model_tasks_must_be_configured_and_hgs_a_subset():
    with pytest.raises(ReasonRLError, match="'reward_models.tasks' names 'gsm8k'"):
        validate_config({"reward_models": {"tasks": ["gsm8k"]}}, "my.yaml")
    with pytest.raises(ReasonRLError, match="'reward_models.hgs.tasks' names 'pycode'"):
        validate_config(
            {
                "tasks": {"arith": {"kind": "arith"}, "pycode": {"kind": "pycode"}},
                "reward_models": {"tasks": ["arith"], "hgs": {"tasks": ["pycode"]}},
            },
            "my.yaml",
        )
    with pytest.raises(ReasonRLError, match="neutral_band"):
        validate_config({"reward_models": {"hgs": {"neutral_band": [0.8, 0.2]}}}, "my.yaml")


FRONTIER = {
    "tasks": {"arith": {"kind": "arith"}, "arith5": {"kind": "arith", "min_ops": 5, "max_ops": 5}},
    "evaluation": {"n_samples": 8},
}


@pytest.mark.parametrize(
    ("calibration", "message"),
    [
        (
            {"frontier_task": "arith6"},
            "config key 'calibration.frontier_task' names 'arith6', which is not under 'tasks'",
        ),
        (
            {"frontier_task": "arith5", "easy_task": "easy"},
            "config key 'calibration.easy_task' names 'easy', which is not under 'tasks'",
        ),
        (
            {"frontier_task": "arith5", "policy": "sft-mix"},
            "config key 'calibration.policy' names 'sft-mix', which is not an SFT policy",
        ),
        (
            {"frontier_task": "arith5", "k": 16},
            "config key 'calibration.k' (16) exceeds evaluation.n_samples (8)",
        ),
        (
            {"frontier_task": "arith5", "gates": {"gap_max": 0.5}},
            "unknown config key 'calibration.gates.gap_max'",
        ),
    ],
)
def test_bad_calibration_is_named(calibration, message):
    with pytest.raises(ReasonRLError, match=re.escape(message)) as err:
        validate_config({**FRONTIER, "calibration": calibration}, "my.yaml")
    assert "\n" not in str(err.value)


def test_calibration_is_off_by_default_and_checked_only_when_on():
    assert validate_config({})["calibration"]["frontier_task"] is None
    # Off: the task names are not read, so nothing to reject.
    validate_config({"calibration": {"easy_task": "nothing"}})
    config = validate_config({**FRONTIER, "calibration": {"frontier_task": "arith5"}})
    assert config["calibration"]["gates"]["gap_min"] == 0.2


@pytest.mark.parametrize("value", ["tiny", "base", "sft-tool", "mdpo-round2", "online-grpo"])
def test_reward_models_base_cannot_name_a_model_of_the_workflow(value):
    """A workflow model's name is no folder or hub id: the reward models would look it up on
    the hub after their data were sampled. `policy` is the way to start from the policy."""
    message = f"config key 'reward_models.base': '{value}' names a model of this workflow"
    with pytest.raises(ReasonRLError, match=re.escape(message)):
        validate_config({"reward_models": {"base": value}}, "c.yaml")


def test_a_reward_models_base_folder_must_exist_when_the_config_is_read(tmp_path):
    folder = tmp_path / "verifier"
    message = f"c.yaml: config key 'reward_models.base': model folder '{folder}' not found"
    with pytest.raises(ReasonRLError, match=re.escape(message)):
        validate_config({"reward_models": {"base": str(folder)}}, "c.yaml")
    folder.mkdir()
    assert validate_config({"reward_models": {"base": str(folder)}})["reward_models"]["base"]

"""The Snakemake workflow: dry-runs of every shipped config, lint, and a tiny end-to-end run."""

from __future__ import annotations

import csv
import json
import re
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from reasonrl.io import read_jsonl

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
CONFIGS = sorted((REPO / "config").glob("*.yaml"))
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def dry_run_jobs(result: subprocess.CompletedProcess) -> list[dict[str, str]]:
    """The jobs a dry-run prints: rule name plus its `key: value` lines (output, log, ...)."""
    jobs = []
    for line in result.stdout.splitlines():
        if match := re.fullmatch(r"(?:local)?rule (\w+):", line):
            jobs.append({"rule": match[1]})
        elif jobs and (match := re.fullmatch(r"    (\w+): (.*)", line)):
            jobs[-1][match[1]] = match[2]
        elif jobs and line.startswith("Shell command: "):
            jobs[-1]["shell"] = line.removeprefix("Shell command: ")
    return jobs


def rule_counts(result: subprocess.CompletedProcess) -> Counter:
    return Counter(job["rule"] for job in dry_run_jobs(result))


def cli_config(job: dict[str, str]) -> dict:
    """The --config-json a job's shell command passes to the CLI."""
    argv = shlex.split(job["shell"])
    return json.loads(argv[argv.index("--config-json") + 1])


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_dry_run_succeeds(snakemake, config):
    result = snakemake("-n", "--directory", str(REPO), "--configfile", str(config))
    assert "This was a dry-run" in result.stdout
    assert rule_counts(result)["report"] == 1


def test_default_dag_runs_every_method_on_the_frontier_and_evaluates_both_bands(snakemake):
    result = snakemake("-n", "-p")
    assert rule_counts(result) == {
        "make_task_data": 2,
        "make_task_pool": 4,
        "build_tiny_policy": 1,
        "sft": 1,
        "evaluate": 13,
        "calibrate": 1,
        "calibration_gate": 1,
        "report": 1,
        "report_pages": 1,
        "augment_prompts": 1,
        "sample_round": 3,
        "label_preferences": 3,
        "reference_logps": 3,
        "preference_train": 3,
        "evaluate_selection": 4,
        "select_best": 1,
        "preference_table": 1,
        "online_dpo": 1,
        "online_dpo_table": 1,
        "sample_rm_data": 1,
        "annotate_prm": 1,
        "train_reward_model": 3,
        "best_of_n": 1,
        "hgs_search": 1,
        "reward_tables": 1,
        "ppo_r2": 1,
        "ppo": 1,
        "ppo_table": 1,
        "all": 1,
    }
    jobs = dry_run_jobs(result)
    evaluations = {job["wildcards"] for job in jobs if job["rule"] == "evaluate"}
    policies = ("base", "sft-tool", "mdpo-round1", "mdpo-round2", "mdpo-round3", "online-async")
    both_bands = {f"policy={p}, task={t}" for p in policies for t in ("arith", "arith3")}
    assert evaluations == both_bands | {"policy=ppo-oracle, task=arith3"}
    # only the calibration's policy samples (evaluation.sampled_policies); the rest is greedy
    samples = {
        job["wildcards"]: cli_config(job)["evaluation"] for job in jobs if job["rule"] == "evaluate"
    }
    for wildcards, evaluation in samples.items():
        sampled = wildcards.startswith("policy=sft-tool,")
        assert (evaluation["n_samples"], evaluation["k"]) == ((8, [1, 8]) if sampled else (0, [1]))
        assert "sampled_policies" not in evaluation  # the list itself reruns no evaluation
    # a method compared on both bands reads each band's trajectories
    [report] = [job for job in jobs if job["rule"] == "report"]
    for task in ("arith", "arith3"):
        arm = f"--arm {task}/online-async=results/eval/online-async/{task}/trajectories.jsonl "
        assert arm in report["shell"]
    # PPO's evaluation joins the summary (on ppo.task, where it is evaluated)
    metrics = shlex.split(report["shell"].split("--metrics", 1)[1].split("--", 1)[0])
    assert "results/eval/ppo-oracle/arith3/metrics.json" in metrics
    # each method reads its own pool of the frontier band; SFT trains on both bands' splits
    inputs = {job["rule"]: job.get("input", "") for job in jobs}
    assert "results/data/arith3/pool-preference/problems.jsonl" in inputs["augment_prompts"]
    assert "results/data/arith3/pool-online_dpo/problems.jsonl" in inputs["online_dpo"]
    assert "results/data/arith3/pool-reward_models/problems.jsonl" in inputs["sample_rm_data"]
    assert "results/data/arith3/pool-ppo/problems.jsonl" in inputs["ppo"]
    assert {"results/data/arith/train.jsonl", "results/data/arith3/train.jsonl"} <= set(
        inputs["sft"].split(", ")
    )


def test_smollm2_config_converts_the_gguf_and_needs_no_tokenizer_corpus(snakemake):
    result = snakemake("-n", "--configfile", "config/smollm2.yaml")
    counts = rule_counts(result)
    assert counts["convert_smollm2"] == 1 and "build_tiny_policy" not in counts
    assert counts["make_task_data"] == 1  # only arith: SFT and evaluation use nothing else


def test_a_recipe_naming_tasks_runs_only_its_own(snakemake):
    """config/test.yaml names arith and pycode: the default's frontier band is not made, nor
    read into the tokenizer corpus."""
    args = ("-n", "-p", "--configfile", "config/config.yaml", "config/test.yaml")
    jobs = dry_run_jobs(snakemake(*args))
    assert not [job for job in jobs if "arith3" in job.get("output", "")]
    [base] = [job for job in jobs if job["rule"] == "build_tiny_policy"]
    corpus = ["results/data/arith/train.jsonl", "results/data/pycode/train.jsonl"]
    assert base["input"].split(", ") == corpus


def test_tokenizer_tasks_pick_the_tokenizer_corpus(snakemake, tmp_path):
    """A recipe that adds pycode but names the default's tasks for its tokenizer keeps the
    default's corpus, hence the default's base."""
    extra = tmp_path / "tok.yaml"
    extra.write_text(
        "tasks: {arith: {kind: arith}, arith3: {kind: arith}, pycode: {kind: pycode}}\n"
        "policy: {tiny: {tokenizer_tasks: [arith, arith3]}}\n"
    )
    jobs = dry_run_jobs(snakemake("-n", "-p", "--configfile", "config/config.yaml", str(extra)))
    [base] = [job for job in jobs if job["rule"] == "build_tiny_policy"]
    corpus = ["results/data/arith/train.jsonl", "results/data/arith3/train.jsonl"]
    assert base["input"].split(", ") == corpus


def test_tokenizer_tasks_is_no_rules_param(snakemake, tmp_path):
    """The key reaches build_tiny_policy as its input files only: no job's config carries
    it, so a results tree from before the key keeps its params, and naming the tasks the
    default already uses changes no job."""
    extra = tmp_path / "tok.yaml"
    extra.write_text("policy: {tiny: {tokenizer_tasks: [arith, arith3]}}\n")

    def job_configs(*configs: str) -> dict[str, dict]:
        jobs = dry_run_jobs(snakemake("-n", "-p", "--configfile", *configs))
        return {
            f"{job['rule']} {job.get('wildcards', '')}": cli_config(job)
            for job in jobs
            if "--config-json" in job.get("shell", "")
        }

    default = job_configs("config/config.yaml")
    assert "build_tiny_policy " in default
    assert not [name for name, config in default.items() if "tokenizer_tasks" in str(config)]
    assert job_configs("config/config.yaml", str(extra)) == default


def test_bt_pairs_enter_the_reward_model_params_only_when_not_the_papers(snakemake, tmp_path):
    extra = tmp_path / "pairs.yaml"
    extra.write_text("reward_models: {bt_pairs: all}\n")

    def rm_configs(*configs: str) -> list[dict]:
        jobs = dry_run_jobs(snakemake("-n", "-p", "--configfile", *configs))
        return [
            cli_config(job)["reward_models"] for job in jobs if job["rule"] == "train_reward_model"
        ]

    assert all("bt_pairs" not in section for section in rm_configs("config/config.yaml"))
    assert {s["bt_pairs"] for s in rm_configs("config/config.yaml", str(extra))} == {"all"}


def test_tables_starts_from_the_defaults_sft_policy(snakemake):
    """config/tables.yaml adds pycode but keeps the default's tokenizer corpus, task data and
    SFT settings, so its sft-tool (every table's start) is the default's policy."""

    def start_jobs(*configs: str) -> dict[str, dict]:
        jobs = dry_run_jobs(snakemake("-n", "-p", "--configfile", *configs))
        wanted = {"build_tiny_policy", "make_task_data", "sft"}
        named = {f"{job['rule']} {job.get('wildcards', '')}".strip(): job for job in jobs}
        return {name: job for name, job in named.items() if name.split()[0] in wanted}

    def inputs_and_config(job: dict) -> dict:
        return {"input": job.get("input"), "config": cli_config(job)}

    default = start_jobs("config/config.yaml")
    tables = start_jobs("config/config.yaml", "config/tables.yaml")
    assert set(default) == {
        "make_task_data task=arith",
        "make_task_data task=arith3",
        "build_tiny_policy",
        "sft variant=tool",
    }
    assert set(tables) == set(default) | {"make_task_data task=pycode", "sft variant=code"}
    for name, job in default.items():
        assert inputs_and_config(tables[name]) == inputs_and_config(job), name


def test_tables_runs_grpo_sync_and_async_at_its_own_lr_k_and_temperature(snakemake):
    """tables.yaml's GRPO variants set lr, K and T apart from online DPO's (the section's),
    and its comparisons declare GRPO's claims."""
    from reasonrl.stages.online_dpo import variant_section

    jobs = dry_run_jobs(
        snakemake("-n", "-p", "--configfile", "config/config.yaml", "config/tables.yaml")
    )
    online = {j["wildcards"]: cli_config(j) for j in jobs if j["rule"] == "online_dpo"}
    assert set(online) == {f"online={n}" for n in ("sync", "async", "grpo-sync", "grpo")}
    settings = {
        name: {k: variant_section(config, name)[k] for k in ("lr", "samples_per_prompt", "mode")}
        for name, config in ((w.removeprefix("online="), c) for w, c in online.items())
    }
    assert settings["grpo"] == {"lr": 1e-4, "samples_per_prompt": 8, "mode": "async"}
    assert settings["grpo-sync"] == {**settings["grpo"], "mode": "sync"}
    assert settings["async"] == {"lr": 1e-5, "samples_per_prompt": 4, "mode": "async"}
    [report] = [job for job in jobs if job["rule"] == "report"]
    declared = {c["name"] for c in cli_config(report)["comparisons"]["declared"]}
    assert {"grpo_vs_sft", "grpo_easy_cost", "async_grpo_vs_sync"} <= declared


def test_hub_id_base_is_passed_through_and_built_by_no_rule(snakemake, tmp_path):
    config = tmp_path / "hub.yaml"
    config.write_text(f"policy:\n  base: {HUB_ID}\n")
    jobs = dry_run_jobs(snakemake("-n", "-p", "--configfile", str(config)))
    assert not {"build_tiny_policy", "convert_smollm2"} & {job["rule"] for job in jobs}
    base_eval = next(j for j in jobs if j["rule"] == "evaluate" and "policy=base" in j["wildcards"])
    assert f"--model {HUB_ID} " in base_eval["shell"]
    assert all(f"--model {HUB_ID} " in j["shell"] for j in jobs if j["rule"] == "sft")
    # PPO and the online learner from the hub's base: its id, where no rule makes a folder
    config.write_text(
        f"policy:\n  base: {HUB_ID}\nppo: {{policy: base}}\nonline_dpo: {{policy: base}}\n"
        "reward_models: {policy: base}\n"
    )
    jobs = dry_run_jobs(snakemake("-n", "-p", "--configfile", str(config)))
    starts = [j for j in jobs if j["rule"] in ("ppo_r2", "ppo", "online_dpo")]
    assert {j["rule"] for j in starts} == {"ppo_r2", "ppo", "online_dpo"}
    assert all(f"--model {HUB_ID} " in j["shell"] for j in starts), starts
    # the reward models start from that base's weights (reward_models.base: policy)
    trained = [j for j in jobs if j["rule"] == "train_reward_model"]
    assert trained and all(f"--model {HUB_ID} " in j["shell"] for j in trained), trained


@pytest.mark.parametrize(
    ("policy_base", "rm_base", "converted", "model"),
    [
        ("tiny", "policy", False, "results/models/sft-tool"),
        ("tiny", "smollm2", True, "results/rm/base-smollm2"),
        ("smollm2", "smollm2", False, "results/models/base"),
        ("tiny", HUB_ID, False, HUB_ID),
    ],
)
def test_reward_models_start_from_reward_models_base_while_the_policy_samples(
    snakemake, tmp_path, policy_base, rm_base, converted, model
):
    """reward_models.base picks the reward models' start: the policy's weights (today's), the
    bundled SmolLM2 (converted by a rule of its own, unless the policy's base is SmolLM2), or
    a hub id no rule makes; their data are still sampled by the policy."""
    config = tmp_path / "rm.yaml"
    config.write_text(f"policy: {{base: {policy_base}}}\nreward_models: {{base: {rm_base}}}\n")
    jobs = dry_run_jobs(snakemake("-n", "-p", "--configfile", "config/config.yaml", str(config)))
    rules = Counter(job["rule"] for job in jobs)
    assert rules["convert_rm_smollm2"] == int(converted)
    trained = [job for job in jobs if job["rule"] == "train_reward_model"]
    assert len(trained) == 3 and all(f"--model {model} " in j["shell"] for j in trained)
    [samples] = [job for job in jobs if job["rule"] == "sample_rm_data"]
    assert "--model results/models/sft-tool " in samples["shell"]


def test_an_sft_entry_trains_its_own_tasks_and_feeds_a_tasks_reward_models(snakemake, tmp_path):
    extra = tmp_path / "code.yaml"
    extra.write_text(
        "sft:\n  variants: [tool, {name: code, tasks: [pycode], max_steps: 7}]\n"
        "reward_models: {tasks: [arith, pycode], task_policies: {pycode: sft-code}}\n"
    )
    # config/test.yaml names arith and pycode
    args = ("--configfile", "config/config.yaml", "config/test.yaml", str(extra))
    jobs = dry_run_jobs(snakemake("-n", "-p", *args))
    sft = {job["wildcards"]: job for job in jobs if job["rule"] == "sft"}
    assert set(sft) == {"variant=tool", "variant=code"}
    code, tool = cli_config(sft["variant=code"]), cli_config(sft["variant=tool"])
    assert (code["sft"]["tasks"], code["sft"]["max_steps"]) == (["pycode"], 7)
    assert (tool["sft"]["tasks"], tool["sft"]["max_steps"]) == (["arith"], 100)
    assert "results/data/pycode/train.jsonl" in sft["variant=code"]["input"]
    assert "arith" not in sft["variant=code"]["input"]
    # The other policy's entry is not in a policy's config: adding one reruns no other SFT.
    assert "variants" not in tool["sft"]
    rm_samples = {j["wildcards"]: j["input"] for j in jobs if j["rule"] == "sample_rm_data"}
    assert "results/models/sft-code" in rm_samples["task=pycode"]
    assert "results/models/sft-tool" in rm_samples["task=arith"]
    evaluated = {j["wildcards"] for j in jobs if j["rule"] == "evaluate"}
    assert "policy=sft-tool, task=arith" in evaluated
    assert not any("policy=sft-code" in wildcards for wildcards in evaluated)  # arith only


@pytest.mark.parametrize(
    ("base", "task"), [("config/config.yaml", "arith3"), ("config/test.yaml", "arith")]
)
def test_search_comparisons_feed_the_report_their_files_and_add_no_job(
    snakemake, tmp_path, base, task
):
    search = {
        f"results/search/{task}/best-of-n/samples.jsonl",
        f"results/search/{task}/best-of-n/scores.jsonl",
        f"results/search/{task}/best-of-n/greedy.jsonl",
        f"results/search/{task}/hgs/trajectories.jsonl",
    }
    jobs = dry_run_jobs(snakemake("-n", "-p", "--configfile", "config/config.yaml", base))
    [report] = [job for job in jobs if job["rule"] == "report"]
    assert search <= set(report["input"].split(", "))
    assert f"--search {task}/best-of-n=results/search/{task}/best-of-n" in report["shell"]
    assert f"--search {task}/hgs=results/search/{task}/hgs" in report["shell"]
    declared = {c["name"] for c in cli_config(report)["comparisons"]["declared"]}
    assert {"prm_vs_maj", "orm_vs_maj", "hgs_vs_greedy"} <= declared
    policies_only = tmp_path / "policies.yaml"
    policies_only.write_text(
        f"comparisons:\n  declared: [{{name: m, a: mdpo-best, b: sft-tool, task: {task}}}]\n"
    )
    args = ("-n", "-p", "--configfile", "config/config.yaml", base, str(policies_only))
    plain = dry_run_jobs(snakemake(*args))
    [report] = [job for job in plain if job["rule"] == "report"]
    assert "results/search" not in report["input"] and "--search" not in report["shell"]
    assert len(plain) == len(jobs)  # best-of-N and HGS run for the reward tables anyway


def without_pools(tmp_path: Path) -> Path:
    """A config file naming the default's tasks less their prompt pools."""
    tasks = yaml.safe_load((REPO / "config/config.yaml").read_text())["tasks"]
    for settings in tasks.values():
        settings.pop("pools", None)
    path = tmp_path / "no-pools.yaml"
    path.write_text(yaml.safe_dump({"tasks": tasks}))
    return path


def test_a_preference_pool_feeds_the_rounds_and_leaves_the_task_splits_alone(snakemake, tmp_path):
    plain = dry_run_jobs(
        snakemake("-n", "-p", "--configfile", "config/config.yaml", str(without_pools(tmp_path)))
    )
    jobs = dry_run_jobs(snakemake("-n", "-p"))
    pools = {job["wildcards"]: job for job in jobs if job["rule"] == "make_task_pool"}
    consumers = ("preference", "online_dpo", "reward_models", "ppo")
    assert set(pools) == {f"task=arith3, pool={consumer}" for consumer in consumers}
    declared = yaml.safe_load((REPO / "config/config.yaml").read_text())["tasks"]["arith3"]
    pool = pools["task=arith3, pool=preference"]
    assert cli_config(pool)["tasks"]["arith3"]["pools"] == declared["pools"]
    augment = next(job for job in jobs if job["rule"] == "augment_prompts")
    assert "results/data/arith3/pool-preference/problems.jsonl" in augment["input"]
    assert "results/data/arith3/train.jsonl" not in augment["input"]
    assert "make_task_pool" not in {job["rule"] for job in plain}
    augment = next(job for job in plain if job["rule"] == "augment_prompts")
    assert "results/data/arith3/train.jsonl" in augment["input"]
    # the train/test rule does not see the pools: declaring one reruns nothing that reads them
    # (the same commands; a dry run lists independent jobs in no fixed order)
    data = sorted(job["shell"] for job in jobs if job["rule"] == "make_task_data")
    assert data == sorted(job["shell"] for job in plain if job["rule"] == "make_task_data")


def test_online_dpo_reward_model_and_ppo_pools_feed_their_rules(snakemake, tmp_path):
    plain = dry_run_jobs(
        snakemake("-n", "-p", "--configfile", "config/config.yaml", str(without_pools(tmp_path)))
    )
    jobs = dry_run_jobs(snakemake("-n", "-p"))
    consumers = {"online_dpo": "online_dpo", "sample_rm_data": "reward_models", "ppo": "ppo"}
    consumers["ppo_r2"] = "ppo"  # the R^2 table samples the prompts PPO trains on
    for rule, consumer in consumers.items():
        pooled = next(job for job in jobs if job["rule"] == rule)
        assert f"results/data/arith3/pool-{consumer}/problems.jsonl" in pooled["input"], rule
        assert "results/data/arith3/train.jsonl" not in pooled["input"], rule
        unpooled = next(job for job in plain if job["rule"] == rule)
        assert "results/data/arith3/train.jsonl" in unpooled["input"], rule
    rm_rules = ("annotate_prm", "train_reward_model")
    for job in (job for job in jobs if job["rule"] in rm_rules):
        assert "results/data/arith3/pool-reward_models/problems.jsonl" in job["input"], job["rule"]


def test_online_dpo_rewarded_by_the_bt_rm_takes_the_tasks_reward_model(snakemake, tmp_path):
    extra = tmp_path / "rm.yaml"
    extra.write_text("online_dpo: {reward: rm}\n")
    jobs = dry_run_jobs(snakemake("-n", "-p", "--configfile", "config/config.yaml", str(extra)))
    online = next(job for job in jobs if job["rule"] == "online_dpo")
    assert "results/rm/arith3/model-bt" in online["input"]
    assert "--reward-model results/rm/arith3/model-bt " in online["shell"]


def test_results_logs_and_benchmarks_mirror_each_other(snakemake):
    for job in dry_run_jobs(snakemake("-n")):
        if job["rule"] == "all":
            continue
        outputs = [Path(out) for out in job["output"].split(", ")]
        # named for its one output, for the folder of its outputs, or for the name its
        # outputs share (calibration.json and calibration.csv), less the suffix
        stems = {outputs[0] if len(outputs) == 1 else outputs[0].parent}
        stems |= {out.with_suffix("") for out in outputs}
        named = [
            stem
            for stem in stems
            if all(out.is_relative_to(stem) or out.with_suffix("") == stem for out in outputs)
            and job["log"] == f"logs/{stem.relative_to('results')}.log"
            and job["benchmark"] == f"benchmarks/{stem.relative_to('results')}.tsv"
        ]
        assert named, job


MODEL_STAGE_SECTIONS = ("policy", "rollout", "generation", "sandbox", "tasks")


SHARED_PREFERENCE_PARTS = {
    "augment_prompts": {"task", "prompts"},
    "sample_round": {"task", "sampling"},
    "label_preferences": {"task", "labelling"},
}


def test_each_stage_gets_only_its_config_sections(snakemake):
    expected = {
        "make_task_data": {"seed", "tasks"},
        "build_tiny_policy": {"seed", "policy"},
        "sft": {"seed", "sft", "policy"},
        "evaluate": {"seed", "evaluation", "policy", "rollout", "generation", "sandbox", "tasks"},
        "report": {"seed", "evaluation", "comparisons"},
        "augment_prompts": {"seed", "preference", "generation", "policy"},
        "sample_round": {"seed", "preference", "rollout", "generation", "sandbox", "policy"},
        "label_preferences": {"seed", "preference"},
        "reference_logps": {"seed", "preference", "policy"},
        "preference_train": {"seed", "preference", "policy"},
        "sample_rm_data": {"seed", "reward_models", *MODEL_STAGE_SECTIONS},
        "annotate_prm": {"seed", "reward_models", *MODEL_STAGE_SECTIONS},
        "mutate_code_prm": {"seed", "reward_models", "sandbox", "tasks"},
        "train_reward_model": {"seed", "reward_models", "policy"},
        "best_of_n": {"seed", "reward_models", *MODEL_STAGE_SECTIONS},
        "hgs_search": {"seed", "reward_models", *MODEL_STAGE_SECTIONS},
        "reward_tables": {"seed", "reward_models"},
    }
    for job in dry_run_jobs(snakemake("-n", "-p")):
        if job["rule"] in expected:
            config = cli_config(job)
            assert set(config) == expected[job["rule"]], job["rule"]
            if "preference" in config:
                # methods share rounds' data; a method's own stages see only its variant
                variants = config["preference"].get("variants")
                assert variants is None or [v["name"] for v in variants] == [
                    job["wildcards"].split("method=")[1].split(",")[0]
                ]
            if job["rule"] in SHARED_PREFERENCE_PARTS:
                # Prompt making, sampling and labelling see none of the training settings.
                assert set(config["preference"]) == SHARED_PREFERENCE_PARTS[job["rule"]]
            if "task=" in job.get("wildcards", "") and "tasks" in expected[job["rule"]]:
                # A task's jobs see only that task, so editing another task reruns nothing here.
                assert list(config["tasks"]) == [job["wildcards"].split("task=")[1]]


@pytest.mark.parametrize("config", ["config/config.yaml", "config/smollm2.yaml"])
def test_snakemake_lint_finds_nothing(snakemake, config):
    result = snakemake("--lint", "--configfile", config, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "command",
    [["snakefmt", "--check", "."], ["ruff", "check", "."], ["ruff", "format", "--check", "."]],
    ids=" ".join,
)
def test_formatters_and_linters_are_clean(command):
    result = subprocess.run(
        [str(VENV_BIN / command[0]), *command[1:]], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- end to end on config/test.yaml (the session's test_run fixture, tests/conftest.py) --------


@pytest.mark.workflow
def test_run_leaves_nothing_to_do(snakemake, test_run):
    result = snakemake("-n", "--configfile", "config/test.yaml", cwd=test_run)
    assert "Nothing to be done" in result.stdout + result.stderr


@pytest.mark.workflow
def test_run_outputs_match_their_schemas(test_run):
    for task in ("arith", "pycode"):
        for split in ("train", "test"):
            assert read_jsonl(test_run / f"results/data/{task}/{split}.jsonl", schema="problem")
    for model in ("base", "sft-tool", "sft-cot"):
        folder = test_run / "results/models" / model
        for name in ("config.json", "model.safetensors", "manifest.json"):
            assert (folder / name).is_file(), folder / name
    for policy in ("base", "sft-tool", "sft-cot"):
        folder = test_run / "results/eval" / policy / "arith"
        trajectories = read_jsonl(folder / "trajectories.jsonl", schema="trajectory")
        metrics = json.loads((folder / "metrics.json").read_text())
        problems = read_jsonl(test_run / "results/data/arith/test.jsonl", schema="problem")
        assert metrics["n_problems"] == len(problems)
        assert len(trajectories) == len(problems) * (1 + metrics["n_samples"])  # greedy + samples
        assert 0.0 <= metrics["greedy_pass@1"] <= 1.0
        assert ("copy_accuracy" in metrics) == (metrics["style"] == "tool")  # arith, tool only
        assert 0.0 <= metrics.get("copy_accuracy", 0.0) <= 1.0
    for name in ("summary.csv", "summary.md", "index.md", "pass_at_1.png", "sft_loss.png"):
        assert (test_run / "results/report" / name).stat().st_size > 0
    assert not list(test_run.glob("results/models/.*.ckpt")), "checkpoints left behind"
    read_jsonl(test_run / "results/rm/arith/shepherd/prm.jsonl", schema="prm_steps")
    read_jsonl(test_run / "results/search/arith/best-of-n/samples.jsonl", schema="trajectory")
    table = json.loads((test_run / "results/search/arith/best-of-n/best_of_n.json").read_text())
    methods = {row["method"] for row in table["rows"]}
    assert {"pass@1", "maj@N", "bt@N", "orm@N", "prm-mean@N", "prm-min@N", "prm-last@N"} <= methods
    hgs = json.loads((test_run / "results/search/arith/hgs/hgs.json").read_text())
    assert set(hgs) >= {"greedy", "hgs", "matched", "sample_then_filter"}
    assert (test_run / "results/report/reward_models/reward_models.md").stat().st_size > 0
    assert not list(test_run.glob("results/rm/arith/.*.ckpt")), "checkpoints left behind"


@pytest.mark.workflow
def test_run_writes_a_log_and_benchmark_per_job(test_run):
    logs = {
        p.relative_to(test_run / "logs").with_suffix("") for p in test_run.rglob("logs/**/*.log")
    }
    benchmarks = {
        p.relative_to(test_run / "benchmarks").with_suffix("")
        for p in test_run.rglob("benchmarks/**/*.tsv")
    }
    assert logs == benchmarks
    # 2 data, base, 2 sft, 4 evaluations, report, report pages; one M-DPO round: prompts,
    # samples, labels, reference, training, 2 selection evaluations, best round, table; RM
    # samples, PRM annotation, 3 reward models, best-of-N, HGS-PRM, reward tables
    assert len(logs) == 28


@pytest.mark.workflow
def test_readme_command_writes_the_runs_results_section_and_checks_it(test_run, tmp_path):
    """`reasonrl readme` (make readme) on the run's report: the README's section names every
    evaluated policy and declared comparison of the run, the rest of the README is kept, and
    --check then passes; a README edited inside the section fails --check."""
    report = test_run / "results/report"
    readme = tmp_path / "README.md"
    original = (REPO / "README.md").read_text()
    readme.write_text(original)
    command = [str(Path(sys.executable).parent / "reasonrl"), "readme", "--config"]
    command += [str(test_run / "config/test.yaml"), "--report-dir", str(report)]
    command += ["--readme", str(readme)]
    subprocess.run(command, check=True, capture_output=True)
    text = readme.read_text()
    section = text[text.index("<!-- results: begin") : text.index("<!-- results: end")]
    with open(report / "summary.csv", newline="") as fh:
        policies = {row["policy"] for row in csv.DictReader(fh)}
    assert policies and all(f"\n| {policy} | " in section for policy in policies)
    for row in json.loads((report / "comparisons.json").read_text()):
        assert f"| {row['name']} | {row['a']} | {row['b']} | {row['n']} |" in section
    assert ("Calibration of" in section) == (report / "calibration.json").exists()
    assert text.replace(section, "") == original.replace(
        original[original.index("<!-- results: begin") : original.index("<!-- results: end")], ""
    )
    subprocess.run([*command, "--check"], check=True, capture_output=True)
    readme.write_text(text.replace("| sft-tool |", "| sft-tool (edited) |", 1))
    stale = subprocess.run([*command, "--check"], capture_output=True, text=True)
    assert stale.returncode != 0
    assert "the results section is not the report's; run `make readme`" in stale.stderr


@pytest.mark.workflow
def test_snakemake_report_renders(snakemake, test_run):
    snakemake("--configfile", "config/test.yaml", "--report", "report.html", cwd=test_run)
    html = (test_run / "report.html").read_text(encoding="utf-8", errors="replace")
    assert "pass_at_1.png" in html and "sft_loss.png" in html


@pytest.mark.workflow
def test_config_change_reruns_only_the_stages_that_read_it(snakemake, test_run):
    config = yaml.safe_load((test_run / "config/test.yaml").read_text())
    config["evaluation"]["temperature"] = 0.7
    (test_run / "config/changed.yaml").write_text(yaml.safe_dump(config))
    result = snakemake("-n", "--configfile", "config/changed.yaml", cwd=test_run)
    assert rule_counts(result) == {
        "evaluate": 4, "report": 1, "preference_table": 1, "report_pages": 1, "all": 1
    }  # fmt: skip


def test_preference_learning_rate_change_keeps_prompts_and_first_round_samples(snakemake, test_run):
    config = yaml.safe_load((test_run / "config/test.yaml").read_text())
    config["preference"]["train"]["lr"] = 1.0e-5
    (test_run / "config/changed.yaml").write_text(yaml.safe_dump(config))
    jobs = dry_run_jobs(snakemake("-n", "--configfile", "config/changed.yaml", cwd=test_run))
    rules = Counter(job["rule"] for job in jobs)
    assert rules["preference_train"] >= 1 and "augment_prompts" not in rules
    for job in jobs:
        if job["rule"] in ("sample_round", "label_preferences"):
            assert "round=1" not in job["wildcards"], job


@pytest.mark.workflow
@pytest.mark.learning
def test_tool_sft_beats_the_untrained_policy(test_run):
    def greedy(policy: str) -> float:
        metrics = test_run / "results/eval" / policy / "arith/metrics.json"
        return json.loads(metrics.read_text())["greedy_pass@1"]

    assert greedy("sft-tool") > greedy("base")


def test_lora_reaches_the_training_rules_and_full_fine_tuning_keeps_their_params(
    snakemake, tmp_path
):
    """sft.lora and preference.train.lora reach their stages; r 0 leaves the setting out of
    the params, so a config from before LoRA reruns nothing."""
    extra = tmp_path / "lora.yaml"
    extra.write_text("sft: {lora: {r: 8}}\npreference: {train: {lora: {r: 4, alpha: 8}}}\n")

    def configs(*files) -> dict[str, dict]:
        result = snakemake("-n", "-p", "--configfile", "config/config.yaml", *files)
        jobs = dry_run_jobs(result)
        return {j["rule"]: cli_config(j) for j in jobs if j["rule"] in ("sft", "preference_train")}

    full, lora = configs(), configs(str(extra))
    assert "lora" not in full["sft"]["sft"]
    assert "lora" not in full["preference_train"]["preference"]["train"]
    assert lora["sft"]["sft"]["lora"]["r"] == 8
    assert lora["preference_train"]["preference"]["train"]["lora"]["alpha"] == 8


def test_lora_reaches_the_rm_ppo_and_online_rules_and_full_fine_tuning_keeps_every_param(
    snakemake, tmp_path
):
    """reward_models.train.lora, ppo.lora and online_dpo.lora reach their stages; r 0 leaves
    them out of the params of every rule that reads those sections (RM data, best-of-N, R^2
    too), so a config from before LoRA reruns nothing."""
    methods = tmp_path / "methods.yaml"
    methods.write_text(
        "ppo: {task: pycode, reward: rm, variants: [{name: m, filter: ppo-m}]}\n"
        "online_dpo: {variants: [{name: a}]}\n"
    )
    extra = tmp_path / "lora.yaml"
    extra.write_text(
        "reward_models: {train: {lora: {r: 8}}}\nppo: {lora: {r: 4}}\nonline_dpo: {lora: {r: 2}}\n"
    )
    sections = {"reward_models": ("train",), "ppo": (), "online_dpo": ()}

    def configs(*files) -> list[tuple[str, dict]]:
        # config/test.yaml names a pycode task, which PPO trains on here (rewarded by its RM)
        args = ("--configfile", "config/config.yaml", "config/test.yaml", *map(str, files))
        jobs = dry_run_jobs(snakemake("-n", "-p", *args))
        return [(j["rule"], cli_config(j)) for j in jobs if "--config-json" in j.get("shell", "")]

    def lora(config: dict, section: str) -> dict | None:
        for key in (section, *sections[section]):
            config = config[key]
        return config.get("lora")

    readers = [(rule, s, config) for rule, config in configs(methods) for s in sections]
    readers = [reader for reader in readers if reader[1] in reader[2]]
    assert {rule for rule, _, _ in readers} >= {
        "sample_rm_data", "train_reward_model", "best_of_n", "ppo_r2", "ppo", "online_dpo"
    }  # fmt: skip
    for rule, section, config in readers:
        assert lora(config, section) is None, (rule, section)
    with_lora = dict(configs(methods, extra))
    assert lora(with_lora["train_reward_model"], "reward_models")["r"] == 8
    assert lora(with_lora["ppo"], "ppo")["r"] == 4
    assert lora(with_lora["online_dpo"], "online_dpo")["r"] == 2


def test_calibration_runs_between_sft_and_the_methods_when_a_frontier_is_set(snakemake):
    jobs = dry_run_jobs(snakemake("-n", "-p"))  # the default sets calibration.frontier_task
    by_rule = {job["rule"]: job for job in jobs}
    calibrate, gate = by_rule["calibrate"], by_rule["calibration_gate"]
    assert calibrate["input"].split(", ") == [
        "results/eval/sft-tool/arith/trajectories.jsonl",
        "results/eval/sft-tool/arith3/trajectories.jsonl",
    ]
    assert "--method-temperature preference.sampling.temperature=0.7 " in calibrate["shell"]
    assert cli_config(calibrate)["evaluation"] == {"temperature": 0.7}
    assert "enforce" not in cli_config(calibrate)["calibration"]  # the gate's alone
    assert gate["input"] == calibrate["output"].split(", ")[0]
    first_round = next(
        j for j in jobs if j["rule"] == "sample_round" and j["wildcards"] == "lineage=sft, round=1"
    )
    for method in (first_round, by_rule["sample_rm_data"], by_rule["online_dpo"]):
        assert gate["output"] in method["input"].split(", ")
    assert "results/report/calibration.json" in by_rule["report"]["input"]
    assert "--calibration results/report/calibration.json " in by_rule["report"]["shell"]


def test_a_config_file_given_twice_is_named_once(snakemake, tmp_path):
    """--configfile config/config.yaml X: the default is also config.yaml; the error names
    each file once, in the order Snakemake merges them."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("sft:\n  learning_rate: 0.1\n")
    result = snakemake("-n", "--configfile", "config/config.yaml", str(bad), check=False)
    assert result.returncode != 0
    error = f"reasonrl: error: {REPO}/config/config.yaml + {bad}: unknown config key"
    assert error in result.stderr

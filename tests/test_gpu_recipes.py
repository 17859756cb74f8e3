"""The GPU recipes in config/: the papers' models (hub ids), vLLM, the GPU image, SFT values,
and the M-DPO values of the preference recipes.

The PF-PPO, async DPO and PRM sections arrive with their issues; until then those recipes
carry their values in comments, and these tests check what the workflow runs today.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
RECIPES = {
    "gpu-mdpo-gemma-7b.yaml": ("google/gemma-1.1-7b-it", 5e-6),
    "gpu-mdpo-mistral-7b.yaml": ("mistralai/Mistral-7B-v0.3", 1e-5),
    "gpu-pfppo-deepseek-coder-6.7b.yaml": ("deepseek-ai/deepseek-coder-6.7b-base", 1e-5),
    "gpu-async-dpo-rho-1b.yaml": ("realtreetune/rho-1b-sft-GSM8K", 1e-6),
    "gpu-prm-math-shepherd-mistral-7b.yaml": ("peiyi9979/mistral-7b-sft", 5e-6),
    # R1-Zero: no SFT, the online learner starts from the hub's base
    "gpu-drgrpo-qwen2.5-math-1.5b.yaml": ("Qwen/Qwen2.5-Math-1.5B", None),
}


def _commands(result, *verbs: str) -> list[list[str]]:
    """The argv of each `reasonrl VERB` shell command a dry run printed (every verb when none
    is named)."""
    prefixes = tuple(f"Shell command: reasonrl {verb} " for verb in verbs) or (
        "Shell command: reasonrl ",
    )
    return [
        shlex.split(line.removeprefix("Shell command: "))
        for line in result.stdout.splitlines()
        if line.startswith(prefixes)
    ]


def _config_json(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--config-json") + 1])


def test_every_gpu_recipe_is_checked():
    assert {p.name for p in (REPO / "config").glob("gpu-*.yaml")} == set(RECIPES)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_dry_run_plans_training_and_evaluation_of_the_papers_model_with_vllm(
    snakemake, name
):
    """SFT from the paper's model (its lr), or, where the paper has no SFT (lr None), the
    online learner from it; every evaluation with vLLM."""
    hub_id, lr = RECIPES[name]
    result = snakemake("-n", "-p", "--configfile", f"config/{name}")
    commands = _commands(result)
    sft = [argv for argv in commands if argv[1] == "sft"]
    starts = sft if lr is not None else [argv for argv in commands if argv[1] == "online-dpo"]
    evaluate = [argv for argv in commands if argv[1] == "evaluate"]
    assert starts and evaluate and (lr is not None or not sft)
    for argv in starts + evaluate:
        model = argv[argv.index("--model") + 1]
        assert model == hub_id or re.fullmatch(
            r"results/models/(sft-(tool|cot)|mdpo-round\d|ppo-[a-z0-9.-]+|online-[a-z0-9.-]+)",
            model,
        )
    assert any(argv[argv.index("--model") + 1] == hub_id for argv in starts)
    for argv in sft:
        assert _config_json(argv)["sft"]["lr"] == lr
    for argv in evaluate:
        assert _config_json(argv)["generation"]["engine"] == "vllm"
    assert yaml.safe_load((REPO / "config" / name).read_text())["containers"]["gpu_images"]


MDPO_RECIPES = {"gpu-mdpo-gemma-7b.yaml": 4e-7, "gpu-mdpo-mistral-7b.yaml": 2e-7}


@pytest.mark.parametrize("name", sorted(MDPO_RECIPES))
def test_mdpo_recipe_runs_three_rounds_with_the_papers_values(snakemake, name):
    result = snakemake("-n", "-p", "--configfile", f"config/{name}")
    trains = _commands(result, "preference-train")
    assert len(trains) == 3
    (augment,) = _commands(result, "augment-prompts")
    sources = [augment[i + 1] for i, flag in enumerate(augment) if flag == "--source"]
    assert sources == [f"{s}=results/data/{s}/train.jsonl" for s in ("metamathqa", "mmiqc")]
    for argv in trains:
        section = _config_json(argv)["preference"]
        assert section["train"]["lr"] == MDPO_RECIPES[name]
        assert section["train"]["global_batch_size"] == 32
        assert (section["sampling"]["latest"], section["sampling"]["previous"]) == (20, 10)
        assert section["prompts"]["selection_size"] == 1000
        assert section["train"]["warmup_steps"] == 40
        assert section["variants"] == [
            {**section["variants"][0], "loss": "mdpo", "beta": 0.1, "rounds": 3}
        ]


@pytest.mark.parametrize("name", sorted(set(RECIPES) - set(MDPO_RECIPES)))
def test_other_recipes_run_no_preference_rounds(snakemake, name):
    result = snakemake("-n", "-p", "--configfile", f"config/{name}")
    assert "rule preference_train:" not in result.stdout


def test_prm_recipe_annotates_with_sixteen_completions_and_trains_at_2e_6(snakemake):
    result = snakemake("-n", "-p", "--configfile", "config/gpu-prm-math-shepherd-mistral-7b.yaml")
    commands = _commands(result, "annotate-prm", "train-reward-model")
    sections = [_config_json(argv) for argv in commands]
    assert any(argv[1] == "annotate-prm" for argv in commands)
    for section in sections:
        rm = section["reward_models"]
        assert rm["tasks"] == ["gsm8k", "math"] and rm["annotation"]["completions"] == 16
        assert rm["train"]["lr"] == 2e-6
        assert rm["train"]["global_batch_size"] == 32


def _option(argv: list[str], name: str) -> list[str]:
    """The values after `name` up to the next option."""
    at = argv.index(name) + 1
    ends = ("--", ">")
    end = next((i for i in range(at, len(argv)) if argv[i].startswith(ends)), len(argv))
    return argv[at:end]


def test_prm_recipe_trains_one_prm_on_gsm8k_and_math_that_both_rank_with(snakemake):
    """reward_models.pooled: one reward model of each kind on both tasks' data, as the
    Math-Shepherd PRM is trained on GSM8K and MATH together; each task's best-of-N uses it."""
    result = snakemake("-n", "-p", "--configfile", "config/gpu-prm-math-shepherd-mistral-7b.yaml")
    trained = {_option(a, "--kind")[0]: a for a in _commands(result, "train-reward-model")}
    assert sorted(trained) == ["bt", "orm", "prm"]
    for kind, argv in trained.items():
        assert _option(argv, "--out") == [f"results/rm/gsm8k+math/model-{kind}"]
        tasks = ("gsm8k", "math")
        assert _option(argv, "--problems") == [f"results/data/{t}/train.jsonl" for t in tasks]
        data = "shepherd/prm.jsonl" if kind == "prm" else "samples/samples.jsonl"
        assert _option(argv, "--data") == [f"results/rm/{t}/{data}" for t in ("gsm8k", "math")]
    ranked = [a for a in _commands(result, "best-of-n") if "--part" not in a]
    assert sorted(_option(a, "--problems")[0] for a in ranked) == [
        "results/data/gsm8k/test.jsonl", "results/data/math/test.jsonl"
    ]  # fmt: skip
    for argv in ranked:
        assert _option(argv, "--prm") == ["results/rm/gsm8k+math/model-prm"]


def test_pfppo_recipe_runs_ppo_with_the_papers_learning_rates(snakemake):
    result = snakemake("-n", "-p", "--configfile", "config/gpu-pfppo-deepseek-coder-6.7b.yaml")
    ppo = _commands(result, "ppo")
    assert sorted(argv[argv.index("--variant") + 1] for argv in ppo) == ["br", "bw", "m", "s"]
    for argv in ppo:
        section = _config_json(argv)["ppo"]
        assert (section["policy_lr"], section["critic_lr"]) == (5e-7, 9e-6)
        assert section["responses_per_prompt"] == 5


@pytest.mark.parametrize(
    ("name", "epochs"), [("gpu-mdpo-gemma-7b.yaml", 3), ("gpu-mdpo-mistral-7b.yaml", 2)]
)
def test_mdpo_recipe_sfts_on_openmath_tool_solutions_for_the_papers_epochs(snakemake, name, epochs):
    # GSM8K and MATH give chain-of-thought gold only: tool SFT on them had nothing to learn
    result = snakemake("-n", "-p", "--configfile", f"config/{name}")
    (sft,) = _commands(result, "sft")
    section = _config_json(sft)["sft"]
    assert sft[sft.index("--style") + 1] == "tool"
    assert section["tasks"] == ["openmath"] and section["epochs"] == epochs
    assert section["warmup_steps"] == 100
    assert sft[sft.index("--train") + 1] == "results/data/openmath/train.jsonl"


def test_async_recipe_samples_at_0_7_with_a_constant_learning_rate(snakemake):
    result = snakemake("-n", "-p", "--configfile", "config/gpu-async-dpo-rho-1b.yaml")
    commands = _commands(result, "online-dpo")
    assert commands
    for argv in commands:
        section = _config_json(argv)["online_dpo"]
        assert (section["temperature"], section["lr_schedule"], section["lr"]) == (
            0.7,
            "constant",
            3e-6,
        )
        # the paper's global batch, accumulated over micro-batches that fit the learner's GPU
        assert (section["prompts_per_step"], section["micro_batch_prompts"]) == (128, 16)


def test_pfppo_recipe_sfts_for_five_epochs(snakemake):
    result = snakemake("-n", "-p", "--configfile", "config/gpu-pfppo-deepseek-coder-6.7b.yaml")
    (sft,) = _commands(result, "sft")
    assert _config_json(sft)["sft"]["epochs"] == 5


def test_prm_recipe_ranks_best_of_n_on_the_whole_test_set(snakemake):
    result = snakemake("-n", "-p", "--configfile", "config/gpu-prm-math-shepherd-mistral-7b.yaml")
    commands = _commands(result, "best-of-n")
    assert commands
    for argv in commands:
        assert _config_json(argv)["reward_models"]["best_of_n"]["max_problems"] == 0


def test_drgrpo_recipe_runs_dr_grpo_from_the_base_prompted_for_a_chain_of_thought(snakemake):
    """R1-Zero-like RL: the online learner starts from the hub's base with no SFT, and the
    base, the learner and the RL policy's evaluation all prompt in policy.style (cot)."""
    result = snakemake("-n", "-p", "--configfile", "config/gpu-drgrpo-qwen2.5-math-1.5b.yaml")
    (online,) = _commands(result, "online-dpo")
    assert online[online.index("--style") + 1] == "cot"
    [variant] = _config_json(online)["online_dpo"]["variants"]
    assert (variant["loss"], variant["grpo"]["aggregation"]) == ("grpo", "dr_grpo")
    evaluations = {
        argv[argv.index("--policy") + 1]: argv[argv.index("--style") + 1]
        for argv in _commands(result, "evaluate")
    }
    assert evaluations == {"base": "cot", "online-drgrpo": "cot"}

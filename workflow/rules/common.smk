# Paths, wildcard constraints and input functions shared by every rule.
#
# A stage's outputs live under results/X, its log at logs/X.log and its benchmark at
# benchmarks/X.tsv. Policies are named by their folder under results/models/ ("base",
# "sft-tool", ...); later issues add rounds (e.g. "round{r}") as further policy names whose
# inputs come from the previous round's policy, resolved here like the ones below.

import json
import shlex


wildcard_constraints:
    task=r"[^/]+",
    variant=r"tool|cot",
    policy=r"base|sft-(tool|cot)",


# Software of every rule (used with --software-deployment-method conda; the venv otherwise).
# Relative to the rule files, which all live in workflow/rules/.
CONDA_ENV = "../../envs/conda-cpu.yaml"


def torch_threads(wildcards):
    """Threads of a model stage (torch reads OMP_NUM_THREADS, which Snakemake sets to them).

    Half the cores each, so two model jobs (the two SFT styles, two evaluations) run side by
    side: small models use one core each better than two cores one job at a time. A
    function, so commands that need no core count (--report) never ask for one; a
    profile's set-threads overrides it.
    """
    return max(1, workflow.cores // 2)


# policy.base values a rule of models.smk builds into BASE_MODEL_DIR.
BUILT_BASES = ("tiny", "smollm2")
BASE_MODEL_DIR = "results/models/base"


def config_json(*sections, task=None):
    """The config reduced to `sections` (plus the seed), as a shell-quoted JSON string.

    Passed as a rule param, so a change to one of these sections reruns the rule and a change
    to any other section does not. With `task`, the "tasks" section keeps only that task.
    """
    reduced = {"seed": config["seed"]}
    for section in sections:
        reduced[section] = config[section]
    if task is not None and "tasks" in reduced:
        reduced["tasks"] = {task: config["tasks"][task]}
    return shlex.quote(json.dumps(reduced, sort_keys=True))


def train_files(tasks):
    """The train split of each task (sft.tasks, or every task for the tokenizer corpus)."""
    return [f"results/data/{task}/train.jsonl" for task in tasks]


def base_is_built():
    """True when a rule of this workflow makes the base policy (else it is a hub id or folder)."""
    return config["policy"]["base"] in BUILT_BASES


def policy_model_input(policy):
    """The model folder of `policy` as a rule input; empty for an external base (no rule makes it)."""
    if policy != "base":
        return f"results/models/{policy}"
    return BASE_MODEL_DIR if base_is_built() else []


def model_arg(wildcards, input):
    """The --model argument: the model input folder, else the external base (hub id or folder)."""
    return input.model or config["policy"]["base"]


def policy_style(policy):
    """Solution style a policy is prompted with: the SFT variant, tool use for the base."""
    return policy.removeprefix("sft-") if policy.startswith("sft-") else "tool"


def evaluated_policies():
    return ["base"] + [f"sft-{variant}" for variant in config["sft"]["variants"]]


def eval_metrics():
    return expand(
        "results/eval/{policy}/{task}/metrics.json",
        policy=evaluated_policies(),
        task=config["evaluation"]["tasks"],
    )


def sft_models():
    return expand("results/models/sft-{variant}", variant=config["sft"]["variants"])


def repeated_flag(flag, paths):
    """`--flag a --flag b` for CLI options that take one value per occurrence."""
    return " ".join(f"{flag} {shlex.quote(str(path))}" for path in paths)


def sft_train_metrics(wildcards, input):
    """The metrics.json inside each SFT model folder (a file in a directory() output)."""
    return " ".join(shlex.quote(f"{model}/metrics.json") for model in input.sft_models)


# --- reward models, best-of-N and HGS-PRM (workflow/rules/reward_models.smk) -----------------

CODE_TASK_KINDS = ("pycode", "humaneval", "mbpp")


def rm_tasks():
    return config["reward_models"]["tasks"]


def prm_data(wildcards):
    """Code tasks get PRM data from mutants; math tasks from Math-Shepherd annotation."""
    source = (
        "mutation"
        if config["tasks"][wildcards.task]["kind"] in CODE_TASK_KINDS
        else "shepherd"
    )
    return f"results/rm/{wildcards.task}/{source}/prm.jsonl"


def rm_training_data(wildcards):
    if wildcards.kind == "prm":
        return prm_data(wildcards)
    return f"results/rm/{wildcards.task}/samples/samples.jsonl"


def rm_policy_model():
    return policy_model_input(config["reward_models"]["policy"])


def reward_model_targets():
    """The reward-model tables when reward_models.tasks names any task, else nothing."""
    return ["results/report/reward_models/reward_models.md"] if rm_tasks() else []


def hgs_tasks():
    return [t for t in config["reward_models"]["hgs"]["tasks"] if t in rm_tasks()]

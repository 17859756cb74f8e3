# Paths, wildcard constraints and input functions shared by every rule.
#
# A stage's outputs live under results/X, its log at logs/X.log and its benchmark at
# benchmarks/X.tsv. Policies are named by their folder under results/models/ ("base",
# "sft-tool", ...); later issues add rounds (e.g. "round{r}") as further policy names whose
# inputs come from the previous round's policy, resolved here like the ones below.

import ast
import json
import re
import shlex
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake_interface_executor_plugins.settings import DeploymentMethod

from reasonrl.config import (
    BUILT_BASES,
    CODE_TASK_KINDS,
    RM_BUILT_BASES,
    search_arm,
    sft_policies,
)
from reasonrl.containers.lock import load_lock
from reasonrl.containers.runner import ContainerSpec, write_rule_shell
from reasonrl.training.launch import command_prefix
from reasonrl.errors import ReasonRLError, exit_with
from reasonrl.memory_plan import (
    check_fits,
    check_global_batches,
    check_launches,
    placement,
    plan_config,
)


wildcard_constraints:
    task=r"[^/]+",
    part=r"\d+",
    variant=r"[a-z][a-z0-9]*",
    policy=r"base|sft-[a-z][a-z0-9]*|[a-z][a-z0-9.-]*-round\d+|online-[a-z][a-z0-9.-]*|ppo-[a-z0-9.-]+",


# Software of every rule (used with --software-deployment-method conda; the venv otherwise).
# Relative to the rule files, which all live in workflow/rules/.
CONDA_ENV = "../../envs/conda-cpu.yaml"


def torch_threads(wildcards):
    """Threads of a model stage (torch reads OMP_NUM_THREADS, which Snakemake sets to them).

    Half the cores each, so two model jobs (the two SFT styles, two evaluations) run side by
    side: small models use one core each better than two cores one job at a time. A
    profile's set-threads overrides it. Commands that schedule nothing (--rulegraph,
    --report) have no core count; they get 1.
    """
    try:
        return max(1, workflow.cores // 2)
    except WorkflowError:
        return 1


# Task kinds loaded from a hub data set unless the task gives a local path.
HUB_TASK_KINDS = ("gsm8k", "math", "mbpp")
BASE_MODEL_DIR = "results/models/base"


def reduced_config(*sections, task=None):
    """The config reduced to `sections` (plus the seed), a fresh dict a rule may edit. With
    `task`, the "tasks" section keeps only that task."""
    reduced = {"seed": config["seed"]}
    for section in sections:
        reduced[section] = params_section(section)
    if task is not None and "tasks" in reduced:
        reduced["tasks"] = {task: config["tasks"][task]}
    return json.loads(json.dumps(reduced))


def json_param(reduced):
    """A rule's reduced config as the shell-quoted JSON string its --config-json takes.

    Passed as a rule param, so a change to the sections it holds reruns the rule and a change
    to any other section does not.
    """
    return shlex.quote(json.dumps(reduced, sort_keys=True))


def config_json(*sections, task=None):
    """`reduced_config` as a rule param (json_param)."""
    return json_param(reduced_config(*sections, task=task))


def prompt_path(consumer, task):
    """The problems a consumer draws its prompts of `task` from: its pool of the task when the
    task declares one (disjoint from what SFT trains and evaluation tests on), else the train
    split."""
    if consumer in config["tasks"][task]["pools"]:
        return f"results/data/{task}/pool-{consumer}/problems.jsonl"
    return f"results/data/{task}/train.jsonl"


def prompt_source(consumer):
    """`prompt_path` of the rule's {task} wildcard."""
    return lambda wildcards: prompt_path(consumer, wildcards.task)


def train_files(tasks):
    """The train split of each task (sft.tasks, or the tokenizer corpus)."""
    return [f"results/data/{task}/train.jsonl" for task in tasks]


def tokenizer_corpus(wildcards):
    """The tiny tokenizer's corpus: policy.tiny.tokenizer_tasks' train splits, else every task's."""
    return train_files(config["policy"]["tiny"]["tokenizer_tasks"] or config["tasks"])


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


# SFT policy name (folder sft-{name}) -> its style, tasks and max_steps.
SFT_POLICIES = sft_policies(config)


def policy_style(policy):
    """Solution style a policy is prompted with: that of the policy it trained from, down to
    an SFT policy's variant or the base's policy.style (a preference round: the SFT policy its
    rounds start from; an online policy: online_dpo.policy), or PPO's ppo.style."""
    if policy.startswith("ppo-"):
        return config["ppo"]["style"]
    if re.fullmatch(r".+-round\d+", policy):
        policy = ROUND0_POLICY
    elif policy.startswith("online-"):
        policy = ONLINE["policy"]
    name = policy.removeprefix("sft-")
    return (
        SFT_POLICIES[name]["style"]
        if name in SFT_POLICIES
        else config["policy"]["style"]
    )


def without_key(section, key):
    """The section (a dict) less `key`, a fresh dict."""
    return {k: v for k, v in section.items() if k != key}


def without_full_fine_tuning(section):
    """A training section less its lora setting where r is 0 (full fine-tuning): the stage
    fills the default back in, and a config from before LoRA keeps its rules' params, so it
    reruns nothing."""
    return section if section["lora"]["r"] else without_key(section, "lora")


def without_tokenizer_tasks(policy):
    """The policy section less policy.tiny.tokenizer_tasks: the key picks the tokenizer's
    corpus, an input of build_tiny_policy (tokenizer_corpus), so no rule needs it as a param,
    and a results tree from before the key keeps every rule's params."""
    return {**policy, "tiny": without_key(policy["tiny"], "tokenizer_tasks")}


def without_paper_pairs(section):
    """The reward_models section less bt_pairs where it is the paper's farthest pair: a
    results tree from before the key keeps its params."""
    return (
        section
        if section["bt_pairs"] != "farthest"
        else without_key(section, "bt_pairs")
    )


def params_section(name):
    """The config section `name` as it goes into params, less the lora setting of a training
    section in it where r is 0 (without_full_fine_tuning), so that every rule reading the
    section (reward-model data, best-of-N, PPO's R^2 too) keeps its params, and less the
    policy's tokenizer_tasks (without_tokenizer_tasks)."""
    section = config[name]
    if name == "policy":
        return without_tokenizer_tasks(section)
    if name in ("sft", "ppo", "online_dpo"):
        return without_full_fine_tuning(section)
    if name == "reward_models":
        return {
            **without_paper_pairs(section),
            "train": without_full_fine_tuning(section["train"]),
        }
    return section


def repeated_flag(flag, paths):
    """`--flag a --flag b` for CLI options that take one value per occurrence."""
    return " ".join(f"{flag} {shlex.quote(str(path))}" for path in paths)


# --- Generation stages spread over jobs (config `split`) ---------------------------------------
SPLIT = config["split"]


def split_parts(stage, folder):
    """Input function: the part folders `stage`'s gathering job adopts, `folder` formatted
    with the job's wildcards and each part index (none when the stage runs as one job).
    """

    def parts(wildcards):
        count = SPLIT[stage]
        if count == 1:
            return []
        return [folder.format(part=i, **dict(wildcards.items())) for i in range(count)]

    return parts


def parts_arg(wildcards, input):
    """--parts for a gathering job (nothing when the stage runs as one job)."""
    parts = list(input.parts)
    return "--parts " + " ".join(shlex.quote(p) for p in parts) if parts else ""


def part_arg(stage):
    """--part I/N for a part job of `stage`."""
    return lambda wildcards: f"--part {wildcards.part}/{SPLIT[stage]}"


CALIBRATION = config["calibration"]
CALIBRATION_JSON = "results/report/calibration.json"
CALIBRATION_GATE = "results/report/calibration_gate.json"


def calibration_on():
    return CALIBRATION["frontier_task"] is not None


def calibration_gate():
    """The gate, an input of each method's first job from an SFT policy (sampling, RM data,
    online DPO, PPO), so a failed gate stops them; nothing while calibration is off.
    ancient: rerunning the gate alone (a new bound, enforce turned off) reruns no method.
    """
    return ancient(CALIBRATION_GATE) if calibration_on() else []


PREFERENCE = config["preference"]
ROUND0_POLICY = PREFERENCE["policy"]


def preference_methods():
    return [variant["name"] for variant in PREFERENCE["variants"]]


def method_settings(method):
    return next(v for v in PREFERENCE["variants"] if v["name"] == method)


def preference_rounds(method):
    return range(1, method_settings(method)["rounds"] + 1)


def round_policy(method, r):
    return ROUND0_POLICY if int(r) == 0 else f"{method}-round{r}"


try:
    IMAGE_LOCK = load_lock(Path(workflow.basedir) / config["containers"]["lock"])
except ReasonRLError as err:
    exit_with(err)


def rule_image(rule_name):
    """The StageImage (ref, digest, network need) of a rule, per config containers.gpu_images."""
    try:
        return IMAGE_LOCK.stage(rule_name, config["containers"]["gpu_images"])
    except ReasonRLError as err:
        exit_with(err)


USES_APPTAINER = (
    DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method
)


def rule_container(rule_name):
    """`container:` of a rule: docker://repository@digest of its published image.

    An image not published yet is an error only where Apptainer would pull it."""
    image = rule_image(rule_name)
    if not image.digest and not USES_APPTAINER:
        return None
    try:
        return image.uri
    except ReasonRLError as err:
        sys.exit(f"reasonrl: error: {err}")


DEEPSPEED_CONFIGS = Path(workflow.basedir) / "profiles/accelerate"


def launcher(wildcards, resources):
    """How a training rule's command starts: one process, accelerate launch over the job's
    GPUs, or, with resource nodes > 1, srun's one launch per node (training.launch)."""
    stage = getattr(resources, "deepspeed", "zero2")
    config_file = DEEPSPEED_CONFIGS / f"deepspeed_{stage}.yaml"
    if not config_file.exists():
        raise ValueError(f"resource deepspeed={stage}: no {config_file}")
    nodes, gpus = int(getattr(resources, "nodes", 0) or 1), int(
        getattr(resources, "gpu", 0) or 0
    )
    mpi = bool(
        getattr(resources, "mpi", None) and getattr(resources, "tasks_per_node", None)
    )
    return command_prefix(nodes, gpus, generator_gpus(resources), config_file, mpi)


def generator_gpus(resources):
    """GPUs of the job that are the generator's own (resource generator_gpus: online_dpo's
    and ppo's)."""
    return int(getattr(resources, "generator_gpus", 0) or 0)


def generator_gpus_arg(wildcards, resources):
    return f"--generator-gpus {generator_gpus(resources)}"


# --- reward models, best-of-N and HGS-PRM (workflow/rules/reward_models.smk) -----------------


def rm_tasks():
    return config["reward_models"]["tasks"]


# With reward_models.pooled every task's reward models are one of each kind, trained on the
# union of the tasks' data, in results/rm/TASK+TASK/ (a task name holds no "+": the schema).
POOL_SEPARATOR = "+"


def rm_folder(task):
    """The folder under results/rm/ of `task`'s reward models: its own, or the pooled one."""
    section = config["reward_models"]
    if section["pooled"] and task in section["tasks"]:
        return POOL_SEPARATOR.join(section["tasks"])
    return task


def reward_model(kind):
    """The {task} wildcard's reward model of `kind` (bt, orm, prm)."""
    return lambda wildcards: f"results/rm/{rm_folder(wildcards.task)}/model-{kind}"


def reward_model_targets():
    """The reward-model tables when reward_models.tasks names any task, else nothing."""
    return ["results/report/reward_models/reward_models.md"] if rm_tasks() else []


ONLINE = config["online_dpo"]


def online_names():
    return [variant["name"] for variant in ONLINE["variants"]]


PPO = config["ppo"]


def ppo_variants():
    return [v["name"] for v in PPO["variants"]]


def bt_reward_model(section):
    """The BT-RM of a section's task (PPO, online DPO), unless the verifier alone rewards."""
    if section["reward"] == "oracle":
        return []
    return f"results/rm/{rm_folder(section['task'])}/model-bt"


def reward_model_arg(wildcards, input):
    return (
        f"--reward-model {shlex.quote(input.reward_model)}"
        if input.reward_model
        else ""
    )


def ppo_eval_metrics(policy):
    return f"results/eval/{policy}/{PPO['task']}/metrics.json"


def ppo_targets():
    """The PPO table when ppo.variants names any variant, else nothing."""
    return ["results/report/ppo/table.md"] if ppo_variants() else []


# --- Declared comparisons (the report rule) -------------------------------------------------------

COMPARISONS = config["comparisons"]["declared"]


# The files of a search stage a search arm is scored from (reasonrl.search.search_arm_scores).
SEARCH_ARM_FILES = {
    "hgs": ["trajectories.jsonl"],
    "greedy": ["greedy.jsonl"],
}
BEST_OF_N_ARM_FILES = ["samples.jsonl", "scores.jsonl"]
MATCHED_ARM_FILES = ["matched.jsonl", "matched_scores.jsonl"]

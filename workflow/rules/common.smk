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

from reasonrl.config import BUILT_BASES, CODE_TASK_KINDS, search_arm, sft_policies
from reasonrl.containers.lock import load_lock
from reasonrl.containers.runner import ContainerSpec, write_rule_shell
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


def task_data_json(wildcards):
    """A task's settings for its train/test rule, without its prompt pools: pools are drawn
    after both splits, so declaring one must not rerun the splits and all that reads them.
    """
    settings = {
        k: v for k, v in config["tasks"][wildcards.task].items() if k != "pools"
    }
    return shlex.quote(
        json.dumps(
            {"seed": config["seed"], "tasks": {wildcards.task: settings}},
            sort_keys=True,
        )
    )


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
    """Solution style a policy is prompted with: its SFT policy's (a preference round's: that
    of the SFT policy its rounds start from), tool use otherwise."""
    if re.fullmatch(r".+-round\d+", policy):
        policy = ROUND0_POLICY
    name = policy.removeprefix("sft-")
    return SFT_POLICIES[name]["style"] if name in SFT_POLICIES else "tool"


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


def sft_config_json(wildcards):
    """The sft stage's config: sft.tasks and sft.max_steps are this policy's own, so adding
    or changing another SFT policy does not rerun it."""
    settings = SFT_POLICIES[wildcards.variant]
    section = {
        key: value
        for key, value in without_full_fine_tuning(config["sft"]).items()
        if key != "variants"
    }
    section.update(tasks=settings["tasks"], max_steps=settings["max_steps"])
    reduced = {
        "seed": config["seed"],
        "sft": section,
        "policy": params_section("policy"),
    }
    return json_param(reduced)


def sft_train_files(wildcards):
    return train_files(SFT_POLICIES[wildcards.variant]["tasks"])


def evaluated_policies():
    """The policies of the summary, each on every evaluation task (easy and frontier band
    reported apart): base, SFT, every preference round and every online DPO run."""
    sft = [f"sft-{name}" for name in SFT_POLICIES]
    online = [f"online-{name}" for name in online_names()]
    return ["base", *sft, *preference_policies(), *online]


def evaluated_tasks(policy):
    """evaluation.tasks, less those an SFT entry with its own task list does not learn: a
    code policy beside the arith one is not scored on arith (a bare style, trained on
    sft.tasks, is scored on every evaluation task, transfer included)."""
    tasks = config["evaluation"]["tasks"]
    settings = SFT_POLICIES.get(policy.removeprefix("sft-"))
    if settings and settings["own_tasks"]:
        return [t for t in tasks if t in settings["tasks"]]
    return tasks


def eval_metrics():
    """Every evaluation the summary lists: the policies of evaluated_policies on their tasks,
    and each PPO run on ppo.task (where it is evaluated)."""
    ppo = [ppo_eval_metrics(f"ppo-{name}") for name in ppo_variants()]
    return [
        f"results/eval/{policy}/{task}/metrics.json"
        for policy in evaluated_policies()
        for task in evaluated_tasks(policy)
    ] + ppo


def sft_models():
    return expand("results/models/sft-{variant}", variant=list(SFT_POLICIES))


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


def sft_train_metrics(wildcards, input):
    """The metrics.json inside each SFT model folder (a file in a directory() output)."""
    return " ".join(shlex.quote(f"{model}/metrics.json") for model in input.sft_models)


# --- Calibration (calibration.smk) -----------------------------------------------------------
# Off while calibration.frontier_task is null: then no rule below takes these inputs and the
# DAG is that of a config without the section.

CALIBRATION = config["calibration"]
CALIBRATION_JSON = "results/report/calibration.json"
CALIBRATION_GATE = "results/report/calibration_gate.json"


def calibration_on():
    return CALIBRATION["frontier_task"] is not None


def calibration_trajectories(band):
    """The start policy's evaluation trajectories on calibration.`band` (easy_task, frontier_task)."""
    return (
        f"results/eval/{CALIBRATION['policy']}/{CALIBRATION[band]}/trajectories.jsonl"
    )


def calibration_config_json():
    """The calibrate stage's config: the calibration section less enforce (read by the gate
    alone) and the temperature its samples were drawn at."""
    section = {k: v for k, v in CALIBRATION.items() if k != "enforce"}
    evaluation = {"temperature": config["evaluation"]["temperature"]}
    reduced = {"seed": config["seed"], "calibration": section, "evaluation": evaluation}
    return json_param(reduced)


def method_temperatures():
    """Config key -> sampling temperature of each method this config runs from an SFT policy."""
    methods = [
        (
            "preference.sampling.temperature",
            PREFERENCE["variants"],
            PREFERENCE["sampling"],
        ),
        ("online_dpo.temperature", ONLINE["variants"], ONLINE),
        ("reward_models.temperature", rm_tasks(), config["reward_models"]),
        ("ppo.temperature", PPO["variants"], PPO),
    ]
    return {key: section["temperature"] for key, runs, section in methods if runs}


def method_temperature_args():
    return repeated_flag(
        "--method-temperature", [f"{k}={t}" for k, t in method_temperatures().items()]
    )


def calibration_gate():
    """The gate, an input of each method's first job from an SFT policy (sampling, RM data,
    online DPO, PPO), so a failed gate stops them; nothing while calibration is off.
    ancient: rerunning the gate alone (a new bound, enforce turned off) reruns no method.
    """
    return ancient(CALIBRATION_GATE) if calibration_on() else []


def calibration_report_input():
    return CALIBRATION_JSON if calibration_on() else []


def calibration_report_arg(wildcards, input):
    return (
        f"--calibration {shlex.quote(input.calibration)}" if input.calibration else ""
    )


# ---- Preference rounds (M-DPO, M-KTO and baselines) ----------------------------------------
# Round 0 is the SFT policy preference.policy (sft-tool by default), whose style the rounds
# sample and are evaluated in; policy {method}-round{r} trains from {method}-round{r-1} on
# data sampled by that lineage. Round 1 samples only the SFT policy, so its data is shared by
# every method (lineage "sft"); later rounds sample the method's own policies.

PREFERENCE = config["preference"]
ROUND0_POLICY = PREFERENCE["policy"]


def preference_methods():
    return [variant["name"] for variant in PREFERENCE["variants"]]


def method_settings(method):
    return next(v for v in PREFERENCE["variants"] if v["name"] == method)


def preference_rounds(method):
    return range(1, method_settings(method)["rounds"] + 1)


def max_preference_round():
    return max((v["rounds"] for v in PREFERENCE["variants"]), default=0)


def preference_policies():
    return [f"{m}-round{r}" for m in preference_methods() for r in preference_rounds(m)]


def round_policy(method, r):
    return ROUND0_POLICY if int(r) == 0 else f"{method}-round{r}"


def lineage_of(method, r):
    """Whose samples round r trains on: the shared SFT samples in round 1."""
    return "sft" if int(r) == 1 else method


def samplers(wildcards):
    """(name, model) of the policies a round samples: round r-1's (latest) and r-2's."""
    r = int(wildcards.round)
    method = wildcards.lineage
    latest = ROUND0_POLICY if r == 1 else round_policy(method, r - 1)
    previous = ROUND0_POLICY if r <= 2 else round_policy(method, r - 2)
    return {"latest": latest, "previous": previous}


def sampler_models(wildcards):
    return [f"results/models/{policy}" for policy in samplers(wildcards).values()]


def sampler_args(wildcards):
    counts = PREFERENCE["sampling"]
    specs = [
        f"{policy}=results/models/{policy}:{counts[which]}"
        for which, policy in samplers(wildcards).items()
    ]
    return repeated_flag("--sampler", specs)


def labelled_dir(method, r):
    return f"results/preference/{lineage_of(method, r)}/round{r}"


def reference_policy(wildcards):
    settings = method_settings(wildcards.method)
    if settings["reference"] == "sft":
        return ROUND0_POLICY
    return round_policy(wildcards.method, int(wildcards.round) - 1)


def needs_reference(method):
    return method_settings(method)["loss"] != "raft"


def reference_input(wildcards):
    if not needs_reference(wildcards.method):
        return []
    return (
        f"results/reference/{wildcards.method}/round{wildcards.round}/reference.jsonl"
    )


def reference_arg(wildcards, input):
    return f"--reference {shlex.quote(input.reference)}" if input.reference else ""


def preference_config_json(method, *sections):
    """config_json of `sections` plus the preference section reduced to `method`, so adding
    a variant (tables.yaml) does not rerun the others."""
    reduced = reduced_config(*sections)
    reduced["preference"] = {
        **PREFERENCE,
        "train": without_full_fine_tuning(PREFERENCE["train"]),
        "variants": [method_settings(method)],
    }
    return json_param(reduced)


def preference_shared_json(*sections, parts):
    """config_json of `sections` plus the task and the preference `parts` a stage whose
    outputs the methods share reads (never the variants or training settings, so a new
    variant or learning rate does not rerun prompt making, sampling or labelling)."""
    reduced = reduced_config(*sections)
    reduced["preference"] = {k: PREFERENCE[k] for k in ("task", *parts)}
    return json_param(reduced)


def evaluation_config_json(wildcards):
    """The evaluate rule's config: greedy pass@1 only for a policy that
    evaluation.sampled_policies leaves out."""
    sections = ("evaluation", "policy", "rollout", "generation", "sandbox", "tasks")
    reduced = reduced_config(*sections, task=wildcards.task)
    sampled = reduced["evaluation"].pop("sampled_policies")
    if sampled is not None and wildcards.policy not in sampled:
        reduced["evaluation"].update(n_samples=0, k=[1])
    return json_param(reduced)


def selection_config_json(task):
    """The evaluation config for the held-out selection set: greedy pass@1 only, so sampling
    settings do not rerun it."""
    sections = ("evaluation", "policy", "rollout", "generation", "sandbox", "tasks")
    reduced = reduced_config(*sections, task=task)
    reduced["evaluation"] = {"tasks": [task], "n_samples": 0, "k": [1]}
    return json_param(reduced)


def selection_metrics(method):
    return [
        f"results/selection/{round_policy(method, r)}/{PREFERENCE['task']}/metrics.json"
        for r in [0, *preference_rounds(method)]
    ]


def table_rows():
    """(label, policy, test metrics) of the SFT start and every round of every method."""
    task = PREFERENCE["task"]
    rows = [("SFT", ROUND0_POLICY)]
    for variant in PREFERENCE["variants"]:
        label = variant["label"] or variant["name"]
        rows += [
            (f"{label} round {r}", f"{variant['name']}-round{r}")
            for r in preference_rounds(variant["name"])
        ]
    return [
        (label, policy, f"results/eval/{policy}/{task}/metrics.json")
        for label, policy in rows
    ]


def table_row_args(wildcards, input):
    specs = [f"{label}={policy}:{path}" for label, policy, path in table_rows()]
    return repeated_flag("--row", specs)


# --- Containers ---------------------------------------------------------------------------
# The `container` directive of each rule calls rule_container(NAME) for its pinned image
# (repository@digest) in the image lock (containers/images.lock.yaml). Apptainer runs it under
# --software-deployment-method apptainer (profiles/slurm); containers.engine docker runs it
# through the Docker API (workflow/rules/docker.smk). Each new rule also gets an entry
# under `stages` in the lock.

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


def config_uses_hub():
    """True when a model or data set comes from a hub (rules that may fetch need the network)."""
    base = config["policy"]["base"]
    hub_base = base not in BUILT_BASES and not Path(base).exists()
    hub_tasks = any(
        task["kind"] in HUB_TASK_KINDS and not task["path"]
        for task in config["tasks"].values()
    )
    return hub_base or hub_tasks


def docker_shell(rule):
    """Under containers.engine docker: the shell (resource shell_exec) that runs the rule in its image."""
    image = rule_image(rule.name)
    gpu = rule.resources.get(
        "gpu"
    )  # a fixed count (a profile's set-resources) or unset
    gpus = 0 if gpu.is_evaluable() else int(gpu.value or 0)
    network = image.network and config_uses_hub()
    # Positional: a line starting with `workdir` would be read as Snakemake's directive.
    digest = image.digest or image.image_id
    spec = ContainerSpec(image.pinned, digest, str(Path.cwd()), network, gpus)
    return str(write_rule_shell(Path(".snakemake/reasonrl-docker") / rule.name, spec))


# --- Multi-GPU training -------------------------------------------------------------------
# A training rule's command starts with launcher(): `reasonrl`, or, when its job has more
# than one GPU to train on (resource gpu, from the profile, less the generator's
# generator_gpus), `accelerate launch` with the DeepSpeed config named by resource deepspeed
# (zero2, the default, or zero3) in profiles/accelerate/.

DEEPSPEED_CONFIGS = Path(workflow.basedir) / "profiles/accelerate"


def launcher(wildcards, resources):
    gpus = int(getattr(resources, "gpu", 0) or 0) - generator_gpus(resources)
    if gpus <= 1:
        return "reasonrl"
    stage = getattr(resources, "deepspeed", "zero2")
    config_file = DEEPSPEED_CONFIGS / f"deepspeed_{stage}.yaml"
    if not config_file.exists():
        raise ValueError(f"resource deepspeed={stage}: no {config_file}")
    return (
        f"accelerate launch --config_file {shlex.quote(str(config_file))}"
        f" --num_processes {gpus} -m reasonrl.cli"
    )


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


def rm_members(wildcards):
    """The tasks whose data train the reward models of results/rm/{task}/: the task, or
    each task of a pooled folder."""
    return wildcards.task.split(POOL_SEPARATOR)


def prm_data(task):
    """Code tasks get PRM data from mutants; math tasks from Math-Shepherd annotation."""
    source = (
        "mutation" if config["tasks"][task]["kind"] in CODE_TASK_KINDS else "shepherd"
    )
    return f"results/rm/{task}/{source}/prm.jsonl"


def rm_training_data(wildcards):
    """Each member task's PRM rows (kind prm) or samples (bt, orm)."""
    if wildcards.kind == "prm":
        return [prm_data(task) for task in rm_members(wildcards)]
    return [
        f"results/rm/{task}/samples/samples.jsonl" for task in rm_members(wildcards)
    ]


def rm_training_problems(wildcards):
    """Each member task's reward-model prompts."""
    return [prompt_path("reward_models", task) for task in rm_members(wildcards)]


def rm_policy_model(wildcards):
    """The SFT policy whose samples and weights a task's reward models start from (a pooled
    folder's tasks share it: the config check)."""
    section = config["reward_models"]
    task = rm_members(wildcards)[0]
    return policy_model_input(section["task_policies"].get(task, section["policy"]))


def rm_table_prms():
    """The PRM of every reward_models task, each folder once."""
    folders = (f"results/rm/{rm_folder(task)}/model-prm" for task in rm_tasks())
    return list(dict.fromkeys(folders))


def reward_model_targets():
    """The reward-model tables when reward_models.tasks names any task, else nothing."""
    return ["results/report/reward_models/reward_models.md"] if rm_tasks() else []


def hgs_tasks():
    return [t for t in config["reward_models"]["hgs"]["tasks"] if t in rm_tasks()]


# ---- Asynchronous online DPO (online_dpo.smk) ------------------------------------------------

ONLINE = config["online_dpo"]


def online_names():
    return [variant["name"] for variant in ONLINE["variants"]]


def online_prompts(wildcards):
    """The online learner's prompts: online_dpo.task's `online_dpo` pool, or its train split."""
    return prompt_path("online_dpo", ONLINE["task"])


def online_label(name):
    variant = next(v for v in ONLINE["variants"] if v["name"] == name)
    return variant["label"] or name


def online_threads(wildcards):
    """Every core: half for the generator, half for the learner (in both modes), and no other
    job runs beside it, so sync and async wall-clocks compare."""
    try:
        return max(1, workflow.cores)
    except WorkflowError:
        return 1


def online_table_args(wildcards, input):
    """--row LABEL=MODEL:EVAL_METRICS per variant, in config order."""
    return repeated_flag(
        "--row",
        [
            f"{online_label(name)}=results/models/online-{name}:"
            f"results/eval/online-{name}/{ONLINE['task']}/metrics.json"
            for name in online_names()
        ],
    )


# --- PPO / PF-PPO (workflow/rules/ppo.smk) ---------------------------------------------------

PPO = config["ppo"]


def ppo_variants():
    return [v["name"] for v in PPO["variants"]]


def ppo_variant_pattern():
    """Wildcard constraint: exactly the configured variant names (none matches when empty)."""
    names = ppo_variants()
    return "|".join(re.escape(n) for n in names) if names else "(?!)"


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


def ppo_prompts(wildcards):
    """PPO's prompts (and the R^2 stage's): ppo.task's ppo pool, else its train split."""
    return prompt_path("ppo", PPO["task"])


def ppo_eval_metrics(policy):
    return f"results/eval/{policy}/{PPO['task']}/metrics.json"


def ppo_table_rows(wildcards, input):
    """--row NAME=EVAL_METRICS:MODEL_DIR of every variant."""
    specs = [
        f"{name}={ppo_eval_metrics(f'ppo-{name}')}:results/models/ppo-{name}"
        for name in ppo_variants()
    ]
    return repeated_flag("--row", specs)


def ppo_targets():
    """The PPO table when ppo.variants names any variant, else nothing."""
    return ["results/report/ppo/table.md"] if ppo_variants() else []


# --- Declared comparisons (the report rule) -------------------------------------------------------

COMPARISONS = config["comparisons"]["declared"]


def comparison_policies(arm):
    """The policies whose test trajectories an arm needs: METHOD-best needs every round of
    the method and the SFT start, since the held-out selection picks among them; a search
    arm needs none (comparison_search_files)."""
    if search_arm(arm):
        return []
    if arm.endswith("-best"):
        method = arm.removesuffix("-best")
        return [round_policy(method, r) for r in [0, *preference_rounds(method)]]
    return [arm]


def comparison_arms():
    """TASK/POLICY -> test trajectories of every arm of every declared comparison (a policy
    compared on two tasks, e.g. its gain on one band and its cost on the other, has two).
    """
    arms = {}
    for comparison in COMPARISONS:
        task = comparison["task"]
        for side in ("a", "b"):
            for policy in comparison_policies(comparison[side]):
                arms[f"{task}/{policy}"] = (
                    f"results/eval/{policy}/{task}/trajectories.jsonl"
                )
    return arms


def comparison_best_files():
    methods = {
        c[side].removesuffix("-best")
        for c in COMPARISONS
        for side in ("a", "b")
        if c[side].endswith("-best")
    }
    return {m: f"results/selection/{m}-best/best.json" for m in sorted(methods)}


# The files of a search stage a search arm is scored from (reasonrl.search.search_arm_scores).
SEARCH_ARM_FILES = {
    "hgs": ["trajectories.jsonl"],
    "greedy": ["greedy.jsonl"],
}
BEST_OF_N_ARM_FILES = ["samples.jsonl", "scores.jsonl"]
MATCHED_ARM_FILES = ["matched.jsonl", "matched_scores.jsonl"]


def search_arm_files(spec):
    if spec.stage == "hgs" and spec.method != "hgs":
        return MATCHED_ARM_FILES  # hgs-matched:SELECTION
    return SEARCH_ARM_FILES.get(spec.method, BEST_OF_N_ARM_FILES)


def comparison_search_folders():
    """TASK/STAGE -> results/search/TASK/STAGE/ of every search arm (hgs, bon:...) that a
    declared comparison names, with the files there it is scored from."""
    folders = {}
    for comparison in COMPARISONS:
        for side in ("a", "b"):
            spec = search_arm(comparison[side])
            if spec:
                key = f"{comparison['task']}/{spec.stage}"
                folders.setdefault(key, set()).update(search_arm_files(spec))
    return {key: sorted(files) for key, files in sorted(folders.items())}


def comparison_search_files():
    return [
        f"results/search/{key}/{name}"
        for key, names in comparison_search_folders().items()
        for name in names
    ]


def comparison_args(wildcards, input):
    arms = [f"{arm}={path}" for arm, path in comparison_arms().items()]
    best = [f"{method}={path}" for method, path in comparison_best_files().items()]
    search = [f"{key}=results/search/{key}" for key in comparison_search_folders()]
    return " ".join(
        [
            repeated_flag("--arm", arms),
            repeated_flag("--best", best),
            repeated_flag("--search", search),
        ]
    )


def comparison_outputs():
    """The report's comparison files when the config declares comparisons, else none."""
    if not COMPARISONS:
        return {}
    files = {
        f"comparisons_{kind}": f"results/report/comparisons.{kind}"
        for kind in ("json", "csv", "md")
    }
    files["comparisons_plot"] = report(
        "results/report/comparisons.png",
        caption="../report/comparisons.rst",
        category="Comparisons",
    )
    return files


# --- Report pages (report.smk) ----------------------------------------------------------------


def report_tables():
    """NAME -> CSV of every result table this config makes, shown as an HTML page each."""
    tables = {"summary": "results/report/summary.csv"}
    if calibration_on():
        tables["calibration"] = "results/report/calibration.csv"
    if COMPARISONS:
        tables["comparisons"] = "results/report/comparisons.csv"
    if config["preference"]["variants"]:
        tables["preference"] = "results/report/preference/table.csv"
    if rm_tasks():
        for name in ("best_of_n", "hgs", "prm_precision_recall"):
            tables[name] = f"results/report/reward_models/{name}.csv"
    if online_names():
        tables["online_dpo"] = "results/report/online_dpo/table.csv"
    if ppo_variants():
        tables["ppo"] = "results/report/ppo/table.csv"
        tables["ppo_r2"] = "results/ppo/r2/r2.csv"
    return tables


def report_curve_inputs():
    """The inputs of the report's curves: the preference table (rounds), and the samples and
    scores of every task's best-of-N stage (best-of-N curves over N)."""
    inputs = {}
    if "preference" in report_tables():
        inputs["preference"] = [report_tables()["preference"]]
    if rm_tasks():
        inputs["best_of_n"] = [
            f"results/search/{task}/best-of-n/{name}"
            for task in rm_tasks()
            for name in BEST_OF_N_ARM_FILES
        ]
    return inputs


def report_curve_outputs():
    """best_of_n.png with its numbers, and rounds.png, for the methods this config runs."""
    inputs = report_curve_inputs()
    outputs = {}
    if "best_of_n" in inputs:
        outputs["best_of_n"] = report(
            "results/report/pages/best_of_n.png",
            caption="../report/best_of_n.rst",
            category="Curves",
        )
        for kind in ("csv", "json"):
            outputs[f"best_of_n_{kind}"] = (
                f"results/report/pages/best_of_n_curves.{kind}"
            )
    if "preference" in inputs:
        outputs["preference"] = report(
            "results/report/pages/rounds.png",
            caption="../report/rounds.rst",
            category="Curves",
        )
    return outputs


def report_pages_args(wildcards, input):
    tables = repeated_flag(
        "--table", [f"{name}={path}" for name, path in report_tables().items()]
    )
    best_of_n = repeated_flag(
        "--best-of-n",
        [f"{task}=results/search/{task}/best-of-n" for task in rm_tasks()],
    )
    preference = repeated_flag(
        "--preference", report_curve_inputs().get("preference", [])
    )
    return f"{tables} {best_of_n} {preference}"


# --- The memory plan (workflow/rules/plan.smk) ----------------------------------------------


def fixed_resource(gpu_rule, name):
    """A resource a profile's set-resources (or default-resources) fixes; None when unset or
    computed per job. Snakemake holds a profile's or --set-resources' string (deepspeed:
    zero3) as an expression it evaluates per job (a bare name that does not evaluate is the
    string itself): a constant one is read here as it would evaluate."""
    value = gpu_rule.resources.get(name)
    if value is None:
        return None
    if not value.is_evaluable():
        return value.value
    raw = getattr(value, "raw", None)
    if not isinstance(raw, str):
        return None  # a function of the job
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        per_job = {"attempt", "threads", "input", "wildcards"}
        return raw if raw.isidentifier() and raw not in per_job else None


def gpu_placements():
    """Rule name -> Placement (reasonrl.memory_plan) of every rule whose job asks for GPUs."""
    names = ("gpu", "deepspeed", "gpu_mem_mb", "generator_gpus")
    placements = {}
    for each in workflow.rules:
        resources = {name: fixed_resource(each, name) for name in names}
        if resources["gpu"]:
            placements[each.name] = placement(each.name, resources)
    return placements

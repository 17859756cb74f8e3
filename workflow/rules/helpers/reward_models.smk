# Helpers of reward_models.smk alone (the rules file includes this one first; `snakemake --lint`
# keeps functions and rules in files of their own).


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
    """The SFT policy whose samples a task's reward models read, and whose weights they start
    from with reward_models.base policy (a pooled folder's tasks share it: the config check).
    """
    section = config["reward_models"]
    task = rm_members(wildcards)[0]
    return policy_model_input(section["task_policies"].get(task, section["policy"]))


# The bundled SmolLM2 converted for the reward models, where the policy's base is another.
RM_SMOLLM2_DIR = "results/rm/base-smollm2"


def rm_converts_smollm2():
    """True when the reward models start from SmolLM2 and no base rule converts it."""
    return (
        config["reward_models"]["base"] == "smollm2"
        and config["policy"]["base"] != "smollm2"
    )


def rm_backbone_model(wildcards):
    """The folder the reward models start from (reward_models.base): the policy's, the
    converted SmolLM2, or none for a hub id or folder that no rule makes."""
    base = config["reward_models"]["base"]
    if base == "policy":
        return rm_policy_model(wildcards)
    if base == "smollm2":
        return RM_SMOLLM2_DIR if rm_converts_smollm2() else BASE_MODEL_DIR
    return []


def rm_backbone_arg(wildcards, input):
    """--model of the reward models' training: as model_arg where they start from the
    policy, else the input folder or the hub id or folder no rule makes."""
    base = config["reward_models"]["base"]
    if base == "policy":
        return model_arg(wildcards, input)
    return input.model or base


def rm_table_prms():
    """The PRM of every reward_models task, each folder once."""
    folders = (f"results/rm/{rm_folder(task)}/model-prm" for task in rm_tasks())
    return list(dict.fromkeys(folders))


def hgs_tasks():
    return [t for t in config["reward_models"]["hgs"]["tasks"] if t in rm_tasks()]

# ---- Asynchronous online DPO (online_dpo.smk) ------------------------------------------------

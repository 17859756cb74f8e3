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
    """The SFT policy whose samples and weights a task's reward models start from (a pooled
    folder's tasks share it: the config check)."""
    section = config["reward_models"]
    task = rm_members(wildcards)[0]
    return policy_model_input(section["task_policies"].get(task, section["policy"]))


def rm_table_prms():
    """The PRM of every reward_models task, each folder once."""
    folders = (f"results/rm/{rm_folder(task)}/model-prm" for task in rm_tasks())
    return list(dict.fromkeys(folders))


def hgs_tasks():
    return [t for t in config["reward_models"]["hgs"]["tasks"] if t in rm_tasks()]

# ---- Asynchronous online DPO (online_dpo.smk) ------------------------------------------------

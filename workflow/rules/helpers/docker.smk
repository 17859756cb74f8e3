# Helpers of docker.smk alone (the rules file includes this one first; `snakemake --lint`
# keeps functions and rules in files of their own).


def config_uses_hub():
    """True when a model or data set comes from a hub (rules that may fetch need the network)."""
    base, rm_base = config["policy"]["base"], config["reward_models"]["base"]
    hub_base = base not in BUILT_BASES and not Path(base).exists()
    hub_base |= rm_base not in RM_BUILT_BASES and not Path(rm_base).exists()
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

# Helpers of plan.smk alone (the rules file includes this one first; `snakemake --lint`
# keeps functions and rules in files of their own).


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
    names = ("gpu", "nodes", "deepspeed", "gpu_mem_mb", "generator_gpus")
    placements = {}
    for each in workflow.rules:
        resources = {name: fixed_resource(each, name) for name in names}
        if resources["gpu"]:
            placements[each.name] = placement(each.name, resources)
    return placements

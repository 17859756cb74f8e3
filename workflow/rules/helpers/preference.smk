# Helpers of preference.smk alone (the rules file includes this one first; `snakemake --lint`
# keeps functions and rules in files of their own).


def max_preference_round():
    return max((v["rounds"] for v in PREFERENCE["variants"]), default=0)


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

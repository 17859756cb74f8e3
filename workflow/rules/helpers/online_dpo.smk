# Helpers of online_dpo.smk alone (the rules file includes this one first; `snakemake --lint`
# keeps functions and rules in files of their own).


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

# Helpers of ppo.smk alone (the rules file includes this one first; `snakemake --lint`
# keeps functions and rules in files of their own).


def ppo_variant_pattern():
    """Wildcard constraint: exactly the configured variant names (none matches when empty)."""
    names = ppo_variants()
    return "|".join(re.escape(n) for n in names) if names else "(?!)"


def ppo_prompts(wildcards):
    """PPO's prompts (and the R^2 stage's): ppo.task's ppo pool, else its train split."""
    return prompt_path("ppo", PPO["task"])


def ppo_table_rows(wildcards, input):
    """--row NAME=EVAL_METRICS:MODEL_DIR of every variant."""
    specs = [
        f"{name}={ppo_eval_metrics(f'ppo-{name}')}:results/models/ppo-{name}"
        for name in ppo_variants()
    ]
    return repeated_flag("--row", specs)

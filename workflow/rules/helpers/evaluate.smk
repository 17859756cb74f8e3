# Helpers of evaluate.smk alone (the rules file includes this one first; `snakemake --lint`
# keeps functions and rules in files of their own).


def evaluation_config_json(wildcards):
    """The evaluate rule's config: greedy pass@1 only for a policy that
    evaluation.sampled_policies leaves out."""
    sections = ("evaluation", "policy", "rollout", "generation", "sandbox", "tasks")
    reduced = reduced_config(*sections, task=wildcards.task)
    sampled = reduced["evaluation"].pop("sampled_policies")
    if sampled is not None and wildcards.policy not in sampled:
        reduced["evaluation"].update(n_samples=0, k=[1])
    return json_param(reduced)

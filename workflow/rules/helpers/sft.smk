# Helpers of sft.smk alone (the rules file includes this one first; `snakemake --lint`
# keeps functions and rules in files of their own).


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

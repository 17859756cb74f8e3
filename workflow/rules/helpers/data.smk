# Helpers of data.smk alone (the rules file includes this one first; `snakemake --lint`
# keeps functions and rules in files of their own).


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
